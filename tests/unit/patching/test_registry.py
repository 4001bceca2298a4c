"""One registry of runtime patches (vllm_kunlun/patching/registry.py): every patch
object the package defines is declared there with its targets, and `patch status` and
the doctor print all of them."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_python
from vllm_kunlun.patching import registry

# Import every module of the package on KunlunPlatform (fake devices), then list each
# AttributePatch object found in a module's globals (alone, in a tuple or a dict).
SCAN = """
import importlib, json, pkgutil
import vllm_kunlun
from vllm.platforms import current_platform
assert type(current_platform).__name__ == "KunlunPlatform"
from vllm_kunlun.patching.attribute import AttributePatch
found = []
for info in pkgutil.walk_packages(vllm_kunlun.__path__, "vllm_kunlun."):
    if info.name == "vllm_kunlun._native" or info.name.endswith(".__main__"):
        continue
    module = importlib.import_module(info.name)
    for value in vars(module).values():
        items = value if isinstance(value, tuple) else (
            tuple(value.values()) if isinstance(value, dict) else (value,))
        for item in items:
            for p in (item if isinstance(item, tuple) else (item,)):
                if isinstance(p, AttributePatch):
                    found.append((p.name, info.name, p.target))
print("FOUND " + json.dumps(sorted(set(found))))
"""


@pytest.fixture(scope="module")
def defined() -> list[tuple[str, str, str]]:
    proc = run_python(SCAN, env={"FAKE_XMLIR_DEVICES": "8"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("FOUND "))
    return [tuple(x) for x in json.loads(line[len("FOUND ") :])]


def test_every_patch_object_is_declared_where_it_lives(
    defined: list[tuple[str, str, str]],
) -> None:
    assert defined, "the scan found no patch at all"
    for name, module, target in defined:
        assert name in registry.BY_NAME, f"{name} ({module}) is not in the registry"
        entry = registry.BY_NAME[name]
        assert entry.module == module, name
        assert target in entry.targets, (name, target)


def test_every_declared_target_has_its_patch_object(
    defined: list[tuple[str, str, str]],
) -> None:
    """No stale entry: each target is a live patch (the schema fix edits torch's
    tables and the CustomOps go into vLLM's out-of-tree registry, not attributes;
    their own tests check them)."""
    live = {(name, target) for name, _, target in defined}
    for entry in registry.REGISTRY:
        if entry.name in registry.NOT_ATTRIBUTES:
            continue
        for target in entry.targets:
            assert (entry.name, target) in live, (entry.name, target)


def test_each_entry_says_why_and_when_it_can_go() -> None:
    assert len({e.name for e in registry.REGISTRY}) == len(registry.REGISTRY)
    for entry in registry.REGISTRY:
        assert entry.targets and entry.why and entry.applied_by
        assert entry.removable_when


def test_state_follows_the_live_patch() -> None:
    from vllm_kunlun.ops.sampling import sampler_patches  # noqa: F401  (the entry's module)

    entry = registry.BY_NAME["kunlun_topk_topp_sampler"]
    (patch,) = registry.live_patches(entry)
    was = patch.applied()
    try:
        patch.revert()
        assert registry.state(entry).startswith("applied by the plugin's worker")
        patch.apply()
        assert registry.state(entry) == "applied in this process"
    finally:
        if not was:
            patch.revert()


def test_an_applied_patch_still_reports_no_mismatch() -> None:
    """What the doctor asks after the worker applied them: each check vets the object
    it replaced, and sees through another patch's wrapper (the TP broadcast wraps
    ``rejection_sample``, which the recovered-token check inspects)."""
    from vllm_kunlun.ops.sampling import sampler_patches
    from vllm_kunlun.patching.attribute import apply_group

    ours = [p for p in sampler_patches.PATCHES if not p.applied()]
    try:
        for p in sampler_patches.PATCHES:
            apply_group((p,))
        assert {p.name: p.mismatch() for p in sampler_patches.PATCHES} == {
            p.name: None for p in sampler_patches.PATCHES
        }
    finally:
        for p in reversed(ours):
            p.revert()


def test_patch_status_and_doctor_list_every_runtime_patch(
    capsys: pytest.CaptureFixture,
) -> None:
    from vllm_kunlun.checks.finding import Context
    from vllm_kunlun.cli import main
    from vllm_kunlun.doctor.patchset import check_patchset

    main(["patch", "status"])
    text = capsys.readouterr().out
    names = [e.name for e in registry.REGISTRY]
    for name in names:
        assert f"  {name} " in text, name
    main(["patch", "status", "--json"])
    payload = json.loads(capsys.readouterr().out)
    # the file patch set's summary line stays last
    assert text.rstrip().splitlines()[-1].startswith(payload["set"] + ": ")
    assert [p["name"] for p in payload["runtime_patches"]] == names
    f = check_patchset(Context(), summary=lambda: (7, 7, {}))
    assert [p["name"] for p in f.details["runtime_patches"]] == names


# ---- one group semantics for every entry: all targets or none --------------------------


@pytest.fixture
def target_module() -> object:
    import sys
    import types

    module = types.ModuleType("vllm_kunlun_test_target")
    module.a = "A"  # type: ignore[attr-defined]
    module.b = "B"  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def _patch(attr: str, make: object = None, problem: str | None = None) -> object:
    from vllm_kunlun.patching.attribute import AttributePatch

    return AttributePatch(
        "group_under_test",
        "vllm_kunlun_test_target",
        attr,
        make or (lambda original: original.lower()),  # type: ignore[arg-type]
        lambda module, original: problem,
    )


def test_a_group_with_one_mismatch_changes_nothing(target_module: object) -> None:
    from vllm_kunlun.patching.attribute import PatchMismatch, apply_group

    group = (_patch("a"), _patch("b", problem="b changed upstream"))
    with pytest.raises(PatchMismatch, match="b changed upstream"):
        apply_group(group)  # type: ignore[arg-type]
    assert (target_module.a, target_module.b) == ("A", "B")  # type: ignore[attr-defined]


def test_a_group_that_fails_part_way_is_rolled_back(target_module: object) -> None:
    from vllm_kunlun.patching.attribute import apply_group

    def boom(original: object) -> object:
        raise RuntimeError("make failed")

    first, second = _patch("a"), _patch("b", make=boom)
    with pytest.raises(RuntimeError, match="make failed"):
        apply_group((first, second))  # type: ignore[arg-type]
    assert target_module.a == "A" and not first.applied()  # type: ignore[attr-defined]
    assert apply_group((_patch("a"), _patch("b")))  # type: ignore[arg-type]
    assert (target_module.a, target_module.b) == ("a", "b")  # type: ignore[attr-defined]
