"""Runtime patch ``kunlun_int8_scaled_mm_kernel``: vLLM finds an int8 kernel for us.

Why: ``init_int8_linear_kernel`` picks from
``kernels.scaled_mm._POSSIBLE_INT8_KERNELS[current_platform._enum]``, which has no
``PlatformEnum.OOT`` entry in vLLM 0.15.1: every W8A8-INT8 checkpoint fails with
``KeyError: <PlatformEnum.OOT: 6>`` while the model is built.
How: replace that module-level dict with a copy that adds
``OOT: [KunlunInt8ScaledMMLinearKernel]`` (``init_int8_linear_kernel`` reads the name at
call time; the check makes sure it still does, and that the signature is 0.15.1's).
When: the module costs seconds to import and only quantized models need it, so the
patch goes in where it is needed, in every process that builds a model:
``apply_if_loaded`` in ``Phase.MODEL_PROCESS`` (the worker and the general plugin run
after their ``VllmConfig``, whose quantization config imports the module, has been
unpickled) and ``apply`` in ``Phase.QUANTIZED_MODEL`` (``verify_quantization``: the
process that builds the config, and an in-process engine). Revertible. Removal: when vLLM registers int8 kernels for
out-of-tree platforms.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching.attribute import (
    AttributePatch,
    PatchMismatch,
    expect_call,
    expect_params,
    platform_resolved,
)
from vllm_kunlun.patching.phases import Phase

logger = init_logger(__name__)

NAME = "kunlun_int8_scaled_mm_kernel"
MODULE = "vllm.model_executor.layers.quantization.kernels.scaled_mm"
_INIT_PARAMS = (
    "is_channelwise",
    "is_static_input_scheme",
    "input_symmetric",
    "module_name",
)


def _check(module: ModuleType, original: Any) -> str | None:
    from vllm.platforms import PlatformEnum

    if not isinstance(original, dict):
        return f"{MODULE}._POSSIBLE_INT8_KERNELS is not a dict"
    if PlatformEnum.OOT in original:
        return (
            "_POSSIBLE_INT8_KERNELS already has kernels for PlatformEnum.OOT (this "
            "vLLM registers its own; the patch is obsolete)"
        )
    init = getattr(module, "init_int8_linear_kernel", None)
    return expect_params(init, "init_int8_linear_kernel", _INIT_PARAMS) or expect_call(
        init, "init_int8_linear_kernel", "_POSSIBLE_INT8_KERNELS"
    )


def _make(original: dict[Any, list[Any]]) -> dict[Any, list[Any]]:
    from vllm.platforms import PlatformEnum

    from vllm_kunlun.ops.int8.int8_kernel import KunlunInt8ScaledMMLinearKernel

    return {**original, PlatformEnum.OOT: [KunlunInt8ScaledMMLinearKernel]}


PATCH = AttributePatch(NAME, MODULE, "_POSSIBLE_INT8_KERNELS", _make, _check)


def apply() -> bool:
    """Apply now (imports vLLM's scaled_mm kernels); True when this call applied it.

    A target that differs from vLLM 0.15.1's is left alone with a warning that says
    what differs: W8A8 layers then fail inside vLLM as they would without the plugin.
    """
    try:
        done = PATCH.apply()
    except PatchMismatch as exc:
        logger.warning_once("vllm-kunlun: %s", str(exc))
        return False
    if done:
        logger.info(
            "vllm-kunlun: runtime patch %s applied (W8A8 int8 layers use "
            "KunlunInt8ScaledMMLinearKernel)",
            NAME,
        )
    return done


def apply_if_loaded() -> bool:
    """Apply only if this process already imported the scaled_mm kernels (a quantized
    model's config did) and vLLM's platform is resolved; cheap otherwise."""
    if MODULE not in sys.modules or not platform_resolved():
        return False
    return apply()


def _apply_in(phase: Phase) -> bool:
    return apply() if phase is Phase.QUANTIZED_MODEL else apply_if_loaded()


# phases.apply_phase's hook (patching/phases.py)
RUNTIME_PATCHES = {NAME: _apply_in}


def revert() -> None:
    PATCH.revert()
