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

from types import ModuleType
from typing import Any

from vllm_kunlun.patching.attribute import (
    AttributePatch,
    expect_call,
    expect_params,
)
from vllm_kunlun.patching.quantized import QuantizedModelPatch

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


# apply / apply_if_loaded / revert and phases.apply_phase's hook: patching/quantized.py
QUANTIZED = QuantizedModelPatch(
    PATCH, "W8A8 int8 layers use KunlunInt8ScaledMMLinearKernel"
)
apply, apply_if_loaded, revert, RUNTIME_PATCHES = QUANTIZED.bindings()
