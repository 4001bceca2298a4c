"""Lazy access to the Kunlun vendor libraries.

Every other module asks here instead of importing a vendor module itself, so the whole
package imports on a machine without the vendor wheels (CI, CUDA hosts, laptops) and a
missing or broken vendor library turns into a reason string, not an ImportError deep in
engine start.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

VENDOR_MODULES = ("torch_xmlir", "kunlun_ops", "xspeedgate_ops")


class VendorUnavailable(RuntimeError):
    """A vendor module is not importable; the message says which and why."""


def load(name: str) -> ModuleType:
    """Import a vendor module or raise VendorUnavailable with the cause."""
    if name not in VENDOR_MODULES:
        raise ValueError(f"{name!r} is not a known vendor module ({VENDOR_MODULES})")
    try:
        return importlib.import_module(name)
    except Exception as exc:  # a broken vendor wheel raises more than ImportError
        raise VendorUnavailable(
            f"{name} is not importable ({type(exc).__name__}: {exc})"
        ) from exc


def try_load(name: str) -> tuple[ModuleType | None, str]:
    """(module, "") when importable, else (None, reason)."""
    try:
        return load(name), ""
    except VendorUnavailable as exc:
        return None, str(exc)


def function(module_name: str, name: str) -> tuple[Callable[..., Any] | None, str]:
    """A declared vendor function, or (None, reason).

    Only names declared in ``ops/contract.py`` may be asked for: the doctor checks
    exactly those against the installed library, so an undeclared call would go
    unchecked until it crashes on a Kunlun host.
    """
    from vllm_kunlun.ops.contract import VENDOR_CONTRACT

    if name not in VENDOR_CONTRACT.get(module_name, {}):
        raise ValueError(
            f"{module_name}.{name} is not declared in vllm_kunlun/ops/contract.py; "
            "declare it there (with the keyword arguments passed) before calling it"
        )
    module, reason = try_load(module_name)
    if module is None:
        return None, reason
    fn = resolve(module, name)
    if not callable(fn):
        version = getattr(module, "__version__", "unknown version")
        return None, f"{module_name} ({version}) has no {name}{_validated(module_name)}"
    return fn, f"{module_name}.{name}"


def resolve(module: ModuleType, dotted: str) -> Any:
    """``module.dotted`` (dots walk attributes), else the torch custom op
    ``torch.ops.<module>.<dotted>`` the module registered on import (xspeedgate_ops'
    kernels live only there); None when neither exists."""
    obj: Any = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            break
    if obj is not None:
        return obj
    import torch

    try:
        return getattr(getattr(torch.ops, module.__name__), dotted)
    except (AttributeError, RuntimeError):
        return None


def _validated(module_name: str) -> str:
    from vllm_kunlun.versions import validated_version

    version = validated_version(module_name)
    return f" (the validated {module_name} {version} has it)" if version else ""


def xmlir_device_count() -> tuple[int, str]:
    """Kunlun device count as the driver reports it, and where it came from.

    ``torch.xpu.device_count()`` is an Intel stub on Kunlun's torch build and always
    reports 0; the count to trust is ``torch_xmlir._XMLIRC._xpu_get_devices_number()``.
    """
    get_count, reason = function("torch_xmlir", "_XMLIRC._xpu_get_devices_number")
    if get_count is None:
        return 0, reason
    try:
        count = int(get_count())
    except Exception as exc:
        return 0, (
            "torch_xmlir._XMLIRC._xpu_get_devices_number() failed "
            f"({type(exc).__name__}: {exc})"
        )
    return count, "torch_xmlir._XMLIRC._xpu_get_devices_number()"
