"""AWQ (``quant_method: awq``, the GEMM packing) served by the weight-only seam, and
the runtime patch ``kunlun_awq_linear_method`` that puts it under vLLM.

Why: vLLM 0.15.1's ``AWQLinearMethod`` calls ``ops.awq_gemm`` / ``awq_dequantize``
from ``vllm._C``, which does not load on torch 2.5.1 or Kunlun, and its Marlin and
Triton variants need CUDA: every AWQ checkpoint fails at the first forward.
How: the subclass (``ops/int4/linear_method.py``) keeps vLLM's ``create_weights``
(``qweight`` ``[K, N/8]`` and ``qzeros`` ``[G, N/8]`` int32 in AutoAWQ's interleaved
nibble order, ``scales`` ``[G, N]``), and after loading unpacks both
(``portable.awq_unpack``), repacks the weight along K in compressed-tensors' layout and
hands weight, scales ``[N, G]`` and zero points ``[N, G]`` to ``ops/int4/seam.py`` (AWQ
weights always carry zero points, so they run the portable chunked kernel; the vendor
``awq_gemm`` is not wired: its ``align_type`` layouts are not documented,
docs/quantization.md). The patch replaces the name ``AWQLinearMethod`` in vLLM's ``awq``
module, which ``AWQConfig.get_quant_method`` looks up at call time, applied in the same
phases as the other quantization patches. Removal: when vLLM's AWQ kernels run on our
platforms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from vllm_kunlun.ops.int4.linear_method import LinearMethodPatch

if TYPE_CHECKING:
    from vllm_kunlun.ops.int4.seam import Prepared

NAME = "kunlun_awq_linear_method"


def _load(method: Any, layer: torch.nn.Module) -> tuple[Prepared, int, int]:
    """AutoAWQ's tensors in the seam's layout (always with zero points)."""
    from vllm_kunlun.ops.int4 import portable, seam

    qweight = layer.qweight.data  # [K, N/8]
    k = qweight.shape[0]
    q = portable.awq_unpack(qweight)  # [K, N]
    packed = portable.pack_cols(q.t().contiguous(), 4)  # [N, K/8]
    zeros = portable.awq_unpack(layer.qzeros.data).t().contiguous()  # [N, G]
    scales = layer.scales.data.t().contiguous()  # [N, G]
    group = method.quant_config.group_size
    group = k if group <= 0 else group
    p = seam.prepare(
        packed, scales, zeros.to(torch.uint8), None, 4, group, scales.dtype
    )
    del layer.qzeros
    return p, 4, group


METHOD = LinearMethodPatch(NAME, "awq", _load, __name__)
PATCH = METHOD.patch
method_class = METHOD.method_class
# phases.apply_phase's hook (patching/phases.py; the phases: patching/quantized.py)
RUNTIME_PATCHES = METHOD.hooks()
