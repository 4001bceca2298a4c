"""GPTQ (``quant_method: gptq``, 4 and 8 bits, ``desc_act`` with ``g_idx``, symmetric
or not, v1 and v2 zero points) served by the weight-only seam, and the runtime patch
``kunlun_gptq_linear_method`` that puts it under vLLM.

Why: vLLM 0.15.1's ``GPTQLinearMethod`` calls ``ops.gptq_shuffle`` / ``gptq_gemm``
from ``vllm._C``, which does not load on torch 2.5.1 or Kunlun (``gptq_marlin``, which
vLLM prefers where it can, needs CUDA): every GPTQ checkpoint fails while loading.
How: the subclass (``ops/int4/linear_method.py``) keeps vLLM's ``create_weights``
(``qweight`` ``[K/f, N]`` packed along K, ``qzeros`` ``[G, N/f]`` packed along N,
``scales`` ``[G, N]``, ``g_idx``), and after loading transposes the weight into
compressed-tensors' layout ``[N, K/f]`` (the same bits: both pack along K, first value
lowest), unpacks the zero points (GPTQ v1 stores ``zero - 1``: the kernels add 1; v2
stores the zero point) and hands everything to ``ops/int4/seam.py``: symmetric layers
(every zero point the type's midpoint) may take the vendor ``gptq_gemm``, others the
portable chunked kernel; ``desc_act`` permutes K once at load (``g_idx`` as loaded: a
row-parallel rank's slice with the whole model's groups). The patch replaces the name
``GPTQLinearMethod`` in vLLM's ``gptq`` module, which ``GPTQConfig.get_quant_method``
looks up at call time. Removal: when vLLM's GPTQ kernels run on our platforms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from vllm_kunlun.ops.int4.linear_method import LinearMethodPatch

if TYPE_CHECKING:
    from vllm_kunlun.ops.int4.seam import Prepared

NAME = "kunlun_gptq_linear_method"


def _load(method: Any, layer: torch.nn.Module) -> tuple[Prepared, int, int]:
    """GPTQ's tensors in the seam's layout: symmetric layers without zero points."""
    from vllm_kunlun.ops.int4 import portable, seam

    c = method.quant_config
    bits = c.weight_bits
    packed = layer.qweight.data.t().contiguous()  # [N, K/f]
    k = packed.shape[1] * portable.pack_factor(bits)
    zeros = portable.unpack_cols(layer.qzeros.data, bits)  # [G, N]
    if not method.use_v2_format:
        zeros = zeros + 1  # GPTQ v1: the kernels add 1
    zeros = zeros.t().contiguous()  # [N, G]
    scales = layer.scales.data.t().contiguous()  # [N, G]
    group = k if c.group_size <= 0 else c.group_size
    g_idx = layer.g_idx.data if c.desc_act and c.group_size > 0 else None
    symmetric = bool((zeros == 1 << (bits - 1)).all())
    p = seam.prepare(
        packed,
        scales,
        None if symmetric else zeros.to(torch.int16),
        g_idx,
        bits,
        group,
        scales.dtype,
    )
    del layer.qzeros
    del layer.g_idx
    return p, bits, group


METHOD = LinearMethodPatch(NAME, "gptq", _load, __name__)
PATCH = METHOD.patch
method_class = METHOD.method_class
# phases.apply_phase's hook (patching/phases.py; the phases: patching/quantized.py)
RUNTIME_PATCHES = METHOD.hooks()
