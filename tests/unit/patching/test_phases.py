"""Runtime patches go in by phase (vllm_kunlun/patching/phases.py): the call sites of
``apply_phase`` in the package's source are exactly the table's, every registry entry
has its module's hook, and nothing outside the defining modules applies a patch itself."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from vllm_kunlun.patching import phases, registry
from vllm_kunlun.patching.phases import Phase

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "vllm_kunlun"
# The verbs patches were applied with before phases; only the modules that define
# registry entries (and patching/ itself) may call them.
OLD_VERBS = {
    "apply",
    "apply_all",
    "apply_one",
    "apply_group",
    "apply_or_warn",
    "apply_if_loaded",
    "install",
    "register_all",
}


def _module_of(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("").parts
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def _calls() -> list[tuple[str, str, ast.Call]]:
    """(module, qualified name of the enclosing function, call) for every call."""
    found = []

    def walk(node: ast.AST, module: str, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                walk(child, module, [*scope, child.name])
                continue
            if isinstance(child, ast.Call):
                found.append((module, ".".join(scope), child))
            walk(child, module, scope)

    for path in sorted(PACKAGE.rglob("*.py")):
        walk(ast.parse(path.read_text()), _module_of(path), [])
    return found


def _name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def test_each_phase_is_applied_exactly_at_its_declared_call_sites() -> None:
    seen: dict[Phase, set[str]] = {phase: set() for phase in Phase}
    for module, scope, call in _calls():
        if _name(call) != "apply_phase" or module == "vllm_kunlun.patching.phases":
            continue
        (arg,) = call.args
        assert isinstance(arg, ast.Attribute), f"{module}:{scope}: apply_phase({arg})"
        assert isinstance(arg.value, ast.Name) and arg.value.id == "Phase"
        seen[Phase[arg.attr]].add(f"{module}:{scope}")
    assert seen == {phase: set(sites) for phase, sites in phases.CALL_SITES.items()}


def test_no_module_applies_a_patch_outside_the_phases() -> None:
    allowed = {entry.module for entry in registry.REGISTRY}
    offenders = [
        f"{module}:{scope}: {_name(call)}()"
        for module, scope, call in _calls()
        if _name(call) in OLD_VERBS
        and module not in allowed
        and not module.startswith("vllm_kunlun.patching")
    ]
    assert offenders == []


def test_every_entry_has_a_phase_and_its_modules_hook() -> None:
    for entry in registry.REGISTRY:
        assert entry.phases and all(isinstance(p, Phase) for p in entry.phases)
        assert len(set(entry.phases)) == len(entry.phases), entry.name
        assert callable(phases.hook(entry.module, entry.name)), entry.name
    for module in {entry.module for entry in registry.REGISTRY}:
        hooks = getattr(importlib.import_module(module), phases.HOOK)
        declared = {e.name for e in registry.REGISTRY if e.module == module}
        assert set(hooks) == declared, module


def test_every_phase_applies_something_and_says_when() -> None:
    used = {phase for entry in registry.REGISTRY for phase in entry.phases}
    assert used == set(Phase) == set(phases.CALL_SITES)
    assert all(phase.sentence for phase in Phase)
    entry = registry.BY_NAME["engine_checkpoint_guard"]
    assert entry.applied_by == Phase.WEIGHT_LOAD.sentence
    assert entry.to_json()["phases"] == ["WEIGHT_LOAD"]


def test_apply_phase_applies_that_phases_entries_in_registry_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, Phase]] = []

    def fake_hook(module: str, name: str) -> phases.PatchHook:
        def apply(phase: Phase) -> bool:
            calls.append((name, phase))
            return name != "kunlun_recovered_token_noise"  # one already in

        return apply

    monkeypatch.setattr(phases, "hook", fake_hook)
    done = phases.apply_phase(Phase.MODEL_PROCESS)
    expected = [e.name for e in registry.REGISTRY if Phase.MODEL_PROCESS in e.phases]
    assert [name for name, _ in calls] == expected
    assert {phase for _, phase in calls} == {Phase.MODEL_PROCESS}
    assert done == [n for n in expected if n != "kunlun_recovered_token_noise"]
    assert "engine_checkpoint_guard" not in expected  # WEIGHT_LOAD only


def test_the_quantized_phase_imports_where_the_model_process_only_looks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm_kunlun.ops.int8 import int8_kernel_table_patch

    seen: list[str] = []
    monkeypatch.setattr(
        int8_kernel_table_patch.QUANTIZED,
        "apply",
        lambda: seen.append("apply") or True,
    )
    monkeypatch.setattr(
        int8_kernel_table_patch.QUANTIZED,
        "apply_if_loaded",
        lambda: seen.append("if_loaded") or False,
    )
    hook = int8_kernel_table_patch.RUNTIME_PATCHES[int8_kernel_table_patch.NAME]
    assert hook(Phase.QUANTIZED_MODEL) is True
    assert hook(Phase.MODEL_PROCESS) is False
    assert seen == ["apply", "if_loaded"]
