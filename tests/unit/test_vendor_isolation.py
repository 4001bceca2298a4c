"""Vendor isolation, enforced: only ``vllm_kunlun/ops/vendor.py`` touches a vendor
library, and every vendor function the package asks for is declared in
``ops/contract.py`` (which the doctor checks against the installed library)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from vllm_kunlun.ops import vendor
from vllm_kunlun.ops.contract import VENDOR_CONTRACT

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_kunlun"
VENDOR = {"torch_xmlir", "kunlun_ops", "xspeedgate_ops", "cocopod"}
GATEWAY = PACKAGE / "ops" / "vendor.py"
# The doctor's contract check loads each declared module to compare signatures.
LOADERS = {GATEWAY, PACKAGE / "doctor" / "vendor_contract.py"}


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in PACKAGE.rglob("*.py")]


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "text"`` bindings, to read ``function(MODULE, NAME)``."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    found[target.id] = node.value.value
    return found


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def test_no_module_imports_a_vendor_library() -> None:
    offenders = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Call) and _dotted(node.func).endswith(
                "import_module"
            ):
                names = [
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant) and isinstance(a.value, str)
                ]
            offenders += [
                f"{path.relative_to(PACKAGE)}:{node.lineno} {n}"
                for n in names
                if n.split(".")[0] in VENDOR
            ]
    assert offenders == []


def test_only_the_gateway_loads_vendor_modules_or_their_torch_ops() -> None:
    offenders = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            name = _dotted(node) if isinstance(node, ast.Attribute) else ""
            torch_ops = any(name.startswith(f"torch.ops.{v}") for v in VENDOR)
            loader = isinstance(node, ast.Call) and _dotted(node.func) in (
                "vendor.try_load",
                "try_load",
                "vendor.load",
            )
            if (torch_ops and path != GATEWAY) or (loader and path not in LOADERS):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == []


def test_every_vendor_function_asked_for_is_declared() -> None:
    """Literal (or module-constant) arguments of ``vendor.function`` calls are in the
    contract; the others are checked at run time by ``vendor.function`` itself."""
    asked = []
    for path, tree in _modules():
        consts = _constants(tree)
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and _dotted(node.func) in ("vendor.function", "function")
                and len(node.args) == 2
            ):
                continue
            values = []
            for arg in node.args:
                if isinstance(arg, ast.Constant):
                    values.append(arg.value)
                elif isinstance(arg, ast.Name) and arg.id in consts:
                    values.append(consts[arg.id])
                else:
                    values.append(None)
            module, name = values
            if module is not None:
                asked.append((path.name, module, name))
    assert ("vendor.py", "torch_xmlir", "_XMLIRC._xpu_get_devices_number") in asked
    for where, module, name in asked:
        assert module in VENDOR_CONTRACT, (where, module)
        if name is not None:
            assert name in VENDOR_CONTRACT[module], (where, module, name)


def test_an_undeclared_vendor_function_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"not declared in vllm_kunlun/ops/contract\.py"
    ):
        vendor.function("kunlun_ops", "some_new_kernel")


def test_the_device_count_goes_through_the_contract(
    fake_vendor_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_XMLIR_DEVICES", "3")
    assert vendor.xmlir_device_count() == (
        3,
        "torch_xmlir._XMLIRC._xpu_get_devices_number()",
    )
