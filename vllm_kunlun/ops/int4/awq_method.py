"""AWQ (``quant_method: awq``, the GEMM packing) served by the weight-only seam, and
the runtime patch ``kunlun_awq_linear_method`` that puts it under vLLM.

Why: vLLM 0.15.1's ``AWQLinearMethod`` calls ``ops.awq_gemm`` / ``awq_dequantize``
from ``vllm._C``, which does not load on torch 2.5.1 or Kunlun, and its Marlin and
Triton variants need CUDA: every AWQ checkpoint fails at the first forward.
How: ``KunlunAWQLinearMethod`` keeps vLLM's ``create_weights`` (``qweight`` ``[K, N/8]``
and ``qzeros`` ``[G, N/8]`` int32 in AutoAWQ's interleaved nibble order, ``scales``
``[G, N]``), and after loading unpacks both (``portable.awq_unpack``), repacks the
weight along K in compressed-tensors' layout and hands weight, scales ``[N, G]`` and
zero points ``[N, G]`` to ``ops/int4/seam.py`` (AWQ weights always carry zero points,
so they run the portable chunked kernel; the vendor ``awq_gemm`` is not wired: its
``align_type`` layouts are not documented, docs/quantization.md). The patch replaces
the name ``AWQLinearMethod`` in vLLM's ``awq`` module, which
``AWQConfig.get_quant_method`` looks up at call time, applied in the same phases as the
other quantization patches. Removal: when vLLM's AWQ kernels run on our platforms.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from vllm_kunlun.patching.attribute import (
    AttributePatch,
    expect_caller,
)
from vllm_kunlun.patching.quantized import QuantizedModelPatch

NAME = "kunlun_awq_linear_method"
MODULE = "vllm.model_executor.layers.quantization.awq"


def _method_class(original: type) -> type:
    from vllm_kunlun.ops.int4 import portable, seam

    class KunlunAWQLinearMethod(original):  # type: ignore[valid-type, misc]
        """vLLM's AWQ linear method with the plugin's weight-only kernel."""

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            qweight = layer.qweight.data  # [K, N/8]
            k = qweight.shape[0]
            q = portable.awq_unpack(qweight)  # [K, N]
            packed = portable.pack_cols(q.t().contiguous(), 4)  # [N, K/8]
            zeros = portable.awq_unpack(layer.qzeros.data).t().contiguous()  # [N, G]
            scales = layer.scales.data.t().contiguous()  # [N, G]
            group = self.quant_config.group_size
            self.group = k if group <= 0 else group
            p = seam.prepare(
                packed,
                scales,
                zeros.to(torch.uint8),
                None,
                4,
                self.group,
                scales.dtype,
            )
            self.gptq_layout = p.gptq_layout
            del layer.qzeros
            seam.attach(layer, p, "qweight", "scales")

        def apply(
            self,
            layer: torch.nn.Module,
            x: torch.Tensor,
            bias: torch.Tensor | None = None,
        ) -> torch.Tensor:
            p = seam.attached(layer, self.gptq_layout, "qweight", "scales")
            return seam.wna16_mm(x, p, bias, 4, self.group)

    # vLLM picks a layer's weight loader by the method's class name
    # (``WEIGHT_LOADER_V2_SUPPORTED``): keep vLLM's, the module says whose it is.
    KunlunAWQLinearMethod.__name__ = "AWQLinearMethod"
    KunlunAWQLinearMethod.__qualname__ = "AWQLinearMethod"
    KunlunAWQLinearMethod.__module__ = __name__
    return KunlunAWQLinearMethod


def _check(module: ModuleType, original: Any) -> str | None:
    if not isinstance(original, type):
        return f"{MODULE}.AWQLinearMethod is not a class"
    for name in ("create_weights", "process_weights_after_loading", "apply"):
        if not callable(getattr(original, name, None)):
            return f"{MODULE}.AWQLinearMethod has no {name}"
    return expect_caller(module, "AWQConfig.get_quant_method", "AWQLinearMethod")


PATCH = AttributePatch(NAME, MODULE, "AWQLinearMethod", _method_class, _check)


def method_class() -> type:
    """The plugin's AWQ linear method class over vLLM's (tests build layers with it)."""
    from vllm.model_executor.layers.quantization import awq

    original = awq.AWQLinearMethod
    if PATCH.applied():
        return original  # type: ignore[no-any-return]
    return _method_class(original)


# apply / apply_if_loaded / revert and the phase hook: patching/quantized.py
QUANTIZED = QuantizedModelPatch(PATCH, "AWQ layers use the plugin's weight-only kernel")
apply = QUANTIZED.apply
apply_if_loaded = QUANTIZED.apply_if_loaded
revert = QUANTIZED.revert
RUNTIME_PATCHES = QUANTIZED.hooks()  # phases.apply_phase's hook (patching/phases.py)
