"""When in a process each runtime patch goes in, and the one function that applies them.

A phase is a moment vLLM gives the plugin (``register()``, the platform's constructor,
argument parsing, the worker, ...). Each entry of ``registry.REGISTRY`` names the phases
it goes in at; each phase has its call sites (``CALL_SITES``), and each call site calls
``apply_phase(Phase.X)`` and nothing else: a test reads the package's source and fails
on a call site the table does not declare, or on a patch applied some other way.

The module that defines an entry exposes one hook, ``RUNTIME_PATCHES``: a dict from the
entry's name to a callable that takes the phase and returns True when that call applied
the patch (its conditions -- torch < 2.6, the platform resolved, a module already
imported -- and its warnings stay with the patch). Modules are imported by name here, so
this layer does not import the layers above it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from vllm_kunlun.patching.registry import REGISTRY, Phase

HOOK = "RUNTIME_PATCHES"
__all__ = ["CALL_SITES", "HOOK", "Phase", "apply_phase", "hook"]


# Where each phase is applied: "module:qualified function name" of every function that
# calls ``apply_phase(Phase.X)``. tests/unit/patching/test_phases.py reads the source.
CALL_SITES: dict[Phase, tuple[str, ...]] = {
    Phase.PROCESS_START: (
        "vllm_kunlun:register",
        "vllm_kunlun.checks.vllm_import:ensure_vllm_importable",
    ),
    Phase.PLATFORM_LOAD: ("vllm_kunlun.platforms.kunlun:KunlunPlatformBase.__init__",),
    Phase.FRONT_END: ("vllm_kunlun.platforms.runtime_fixes:prepare_front_end",),
    Phase.MODEL_PROCESS: ("vllm_kunlun.platforms.runtime_fixes:prepare_model_process",),
    Phase.WEIGHT_LOAD: ("vllm_kunlun.platforms.runtime_fixes:prepare_model_process",),
    Phase.QUANTIZED_MODEL: (
        "vllm_kunlun.platforms.kunlun:KunlunPlatformBase.verify_quantization",
    ),
    Phase.HYBRID_MODEL: (
        "vllm_kunlun.models.qwen3_5:Qwen3_5ForCausalLM.__init__",
        "vllm_kunlun.models.qwen3_next:Qwen3NextForCausalLM.__init__",
    ),
    Phase.NATIVE_KERNELS: (
        "vllm_kunlun.platforms.kunlun:KunlunPlatformBase.import_kernels",
    ),
}

PatchHook = Callable[[Phase], bool]


def hook(module: str, name: str) -> PatchHook:
    """The callable that applies registry entry ``name``, from its module's hook."""
    hooks = getattr(importlib.import_module(module), HOOK)
    return hooks[name]  # type: ignore[no-any-return]


def apply_phase(phase: Phase) -> list[str]:
    """Apply every registry entry of ``phase``, in registry order; the names applied
    now. Idempotent: an entry already in is skipped by its own hook. A hook that cannot
    apply warns (or raises, where running without the patch would be wrong)."""
    return [
        entry.name
        for entry in REGISTRY
        if phase in entry.phases and hook(entry.module, entry.name)(phase)
    ]
