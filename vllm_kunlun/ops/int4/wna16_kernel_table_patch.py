"""Runtime patch ``kunlun_wna16_linear_kernel``: vLLM finds a weight-only integer
kernel for us.

Why: ``choose_mp_linear_kernel`` walks
``kernels.mixed_precision._POSSIBLE_KERNELS``, whose every entry in vLLM 0.15.1 needs
CUDA or ``vllm._C`` (the CPU one declines any platform but ``CpuPlatform``): every
compressed-tensors W4A16 / W8A16 checkpoint fails with "Failed to find a kernel that
can implement the WNA16 linear layer" while the model is built.
How: replace that module-level list with a copy that starts with
``KunlunWNA16LinearKernel`` (``choose_mp_linear_kernel`` reads the name at call time;
the check makes sure it still does, and that the signature is 0.15.1's). The kernel
declines on any platform but ours, so other platforms choose as before.
When: as ``kunlun_int8_scaled_mm_kernel`` (the same phases): ``apply_if_loaded`` in
``Phase.MODEL_PROCESS`` and ``apply`` in ``Phase.QUANTIZED_MODEL``. Revertible.
Removal: when vLLM lists a mixed-precision kernel that runs on out-of-tree platforms.
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

NAME = "kunlun_wna16_linear_kernel"
MODULE = "vllm.model_executor.layers.quantization.kernels.mixed_precision"
_CHOOSE_PARAMS = ("config", "compute_capability")


def _check(module: ModuleType, original: Any) -> str | None:
    if not isinstance(original, list):
        return f"{MODULE}._POSSIBLE_KERNELS is not a list"
    choose = getattr(module, "choose_mp_linear_kernel", None)
    return expect_params(
        choose, "choose_mp_linear_kernel", _CHOOSE_PARAMS
    ) or expect_call(choose, "choose_mp_linear_kernel", "_POSSIBLE_KERNELS")


def _make(original: list[Any]) -> list[Any]:
    from vllm_kunlun.ops.int4.wna16_kernel import KunlunWNA16LinearKernel

    return [KunlunWNA16LinearKernel, *original]


PATCH = AttributePatch(NAME, MODULE, "_POSSIBLE_KERNELS", _make, _check)


# apply / apply_if_loaded / revert and phases.apply_phase's hook: patching/quantized.py
QUANTIZED = QuantizedModelPatch(
    PATCH, "weight-only integer layers use KunlunWNA16LinearKernel"
)
apply, apply_if_loaded, revert, RUNTIME_PATCHES = QUANTIZED.bindings()
