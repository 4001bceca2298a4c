"""GPTQ (``quant_method: gptq``, 4 and 8 bits, ``desc_act`` with ``g_idx``, symmetric
or not, v1 and v2 zero points) served by the weight-only seam, and the runtime patch
``kunlun_gptq_linear_method`` that puts it under vLLM.

Why: vLLM 0.15.1's ``GPTQLinearMethod`` calls ``ops.gptq_shuffle`` / ``gptq_gemm``
from ``vllm._C``, which does not load on torch 2.5.1 or Kunlun (``gptq_marlin``, which
vLLM prefers where it can, needs CUDA): every GPTQ checkpoint fails while loading.
How: ``KunlunGPTQLinearMethod`` keeps vLLM's ``create_weights`` (``qweight`` ``[K/f, N]``
packed along K, ``qzeros`` ``[G, N/f]`` packed along N, ``scales`` ``[G, N]``,
``g_idx``), and after loading transposes the weight into compressed-tensors' layout
``[N, K/f]`` (the same bits: both pack along K, first value lowest), unpacks the zero
points (GPTQ v1 stores ``zero - 1``: the kernels add 1; v2 stores the zero point) and
hands everything to ``ops/int4/seam.py``: symmetric layers (every zero point the type's
midpoint) may take the vendor ``gptq_gemm``, others the portable chunked kernel;
``desc_act`` permutes K once at load (``g_idx`` as loaded: a row-parallel rank's slice
with the whole model's groups). The patch replaces the name ``GPTQLinearMethod`` in
vLLM's ``gptq`` module, which ``GPTQConfig.get_quant_method`` looks up at call time.
Removal: when vLLM's GPTQ kernels run on our platforms.
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

NAME = "kunlun_gptq_linear_method"
MODULE = "vllm.model_executor.layers.quantization.gptq"


def _method_class(original: type) -> type:
    from vllm_kunlun.ops.int4 import portable, seam

    class KunlunGPTQLinearMethod(original):  # type: ignore[valid-type, misc]
        """vLLM's GPTQ linear method with the plugin's weight-only kernel."""

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            c = self.quant_config
            bits = c.weight_bits
            packed = layer.qweight.data.t().contiguous()  # [N, K/f]
            k = packed.shape[1] * portable.pack_factor(bits)
            zeros = portable.unpack_cols(layer.qzeros.data, bits)  # [G, N]
            if not self.use_v2_format:
                zeros = zeros + 1  # GPTQ v1: the kernels add 1
            zeros = zeros.t().contiguous()  # [N, G]
            scales = layer.scales.data.t().contiguous()  # [N, G]
            self.group = k if c.group_size <= 0 else c.group_size
            g_idx = layer.g_idx.data if c.desc_act and c.group_size > 0 else None
            symmetric = bool((zeros == 1 << (bits - 1)).all())
            p = seam.prepare(
                packed,
                scales,
                None if symmetric else zeros.to(torch.int16),
                g_idx,
                bits,
                self.group,
                scales.dtype,
            )
            self.gptq_layout = p.gptq_layout
            del layer.qzeros
            del layer.g_idx
            seam.attach(layer, p, "qweight", "scales")

        def apply(
            self,
            layer: torch.nn.Module,
            x: torch.Tensor,
            bias: torch.Tensor | None = None,
        ) -> torch.Tensor:
            p = seam.attached(layer, self.gptq_layout, "qweight", "scales")
            return seam.wna16_mm(x, p, bias, self.quant_config.weight_bits, self.group)

    # vLLM picks a layer's weight loader by the method's class name
    # (``WEIGHT_LOADER_V2_SUPPORTED``): keep vLLM's, the module says whose it is.
    KunlunGPTQLinearMethod.__name__ = "GPTQLinearMethod"
    KunlunGPTQLinearMethod.__qualname__ = "GPTQLinearMethod"
    KunlunGPTQLinearMethod.__module__ = __name__
    return KunlunGPTQLinearMethod


def _check(module: ModuleType, original: Any) -> str | None:
    if not isinstance(original, type):
        return f"{MODULE}.GPTQLinearMethod is not a class"
    for name in ("create_weights", "process_weights_after_loading", "apply"):
        if not callable(getattr(original, name, None)):
            return f"{MODULE}.GPTQLinearMethod has no {name}"
    return expect_caller(module, "GPTQConfig.get_quant_method", "GPTQLinearMethod")


PATCH = AttributePatch(NAME, MODULE, "GPTQLinearMethod", _method_class, _check)


def method_class() -> type:
    """The plugin's GPTQ linear method class over vLLM's (tests build layers with it)."""
    from vllm.model_executor.layers.quantization import gptq

    original = gptq.GPTQLinearMethod
    if PATCH.applied():
        return original  # type: ignore[no-any-return]
    return _method_class(original)


# apply / apply_if_loaded / revert and the phase hook: patching/quantized.py
QUANTIZED = QuantizedModelPatch(
    PATCH, "GPTQ layers use the plugin's weight-only kernel"
)
apply = QUANTIZED.apply
apply_if_loaded = QUANTIZED.apply_if_loaded
revert = QUANTIZED.revert
RUNTIME_PATCHES = QUANTIZED.hooks()  # phases.apply_phase's hook (patching/phases.py)
