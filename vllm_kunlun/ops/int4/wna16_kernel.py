"""``KunlunWNA16LinearKernel``: vLLM's mixed-precision (weight-only integer) kernel on
our platforms.

Why: vLLM's compressed-tensors ``CompressedTensorsWNA16`` scheme (W4A16 / W8A16
``pack-quantized``, group or channel scales, symmetric or with zero points) asks
``choose_mp_linear_kernel`` for a kernel; every kernel vLLM 0.15.1 lists needs CUDA or
``vllm._C`` (its CPU kernel only runs on ``CpuPlatform``), so such checkpoints fail
while the model is built.
How: after loading, the packed weight is put in compressed-tensors' layout (``[N, K/f]``
int32 along K), scales ``[N, G]``, zero points unpacked to ``[N, G]``, and
``ops/int4/seam.py`` lays them out for the path chosen for the device (vendor
``gptq_gemm`` or the portable chunked kernel); each forward is one call of
``torch.ops.vllm_kunlun.wna16_mm``. ``can_implement`` refuses a tensor-parallel split
that cuts a group, naming the split. Listed first in vLLM's kernel list by the runtime
patch ``kunlun_wna16_linear_kernel`` (``ops/int4/wna16_kernel_table_patch.py``); it
declines everywhere but a vllm-kunlun platform. Removal: when vLLM selects a working
mixed-precision kernel for out-of-tree platforms itself.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.quantization.kernels.mixed_precision.MPLinearKernel import (
    MPLinearKernel,
    MPLinearLayerConfig,
)
from vllm.model_executor.parameter import BasevLLMParameter, permute_param_layout_
from vllm.scalar_type import scalar_types

from vllm_kunlun.ops.int4 import portable, seam

SUPPORTED_TYPES = (
    scalar_types.uint4b8,
    scalar_types.uint4,
    scalar_types.uint8b128,
    scalar_types.uint8,
)


def _data(p: torch.Tensor, **layout: int) -> torch.Tensor:
    if isinstance(p, BasevLLMParameter):
        permute_param_layout_(p, **layout)
    return p.data


class KunlunWNA16LinearKernel(MPLinearKernel):
    @classmethod
    def get_min_capability(cls) -> int:
        return 0

    @classmethod
    def can_implement(cls, c: MPLinearLayerConfig) -> tuple[bool, str | None]:
        from vllm_kunlun.ops.active_platform import active_plugin_platform

        if active_plugin_platform() is None:
            return False, "requires a vllm-kunlun platform (Kunlun or host emulation)"
        if c.weight_type not in SUPPORTED_TYPES:
            return False, (
                f"weight type {c.weight_type} (vllm-kunlun serves 4-bit and 8-bit "
                "integer weights)"
            )
        k, n = c.partition_weight_shape
        f = portable.pack_factor(c.weight_type.size_bits)
        if k % f or n % f:
            return False, f"partition [in {k}, out {n}] is not a multiple of {f}"
        if c.group_size > 0 and k % c.group_size:
            full_k = c.full_weight_shape[0]
            split = full_k // k if k else 0
            return False, (
                f"tensor parallel {split} cuts a quantization group: {full_k} input "
                f"features split {split} ways leave {k} per rank, not a multiple of "
                f"group_size {c.group_size}; serve with a tensor-parallel size that "
                f"divides {full_k // c.group_size} (the number of groups)"
            )
        return True, None

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        c = self.config
        bits = c.weight_type.size_bits
        w_q, w_s, w_zp, w_gidx = self._get_weight_params(layer)
        packed = _data(w_q, input_dim=1, output_dim=0, packed_dim=1)  # [N, K/f]
        scales = _data(w_s, input_dim=1, output_dim=0)  # [N, G]
        zeros = None
        if c.zero_points:
            assert w_zp is not None
            zp = _data(w_zp, input_dim=1, output_dim=0, packed_dim=0)  # [N/f, G]
            zeros = portable.unpack_cols(zp.t().contiguous(), bits).t()  # [N, G]
            zeros = zeros.to(torch.uint8 if bits <= 8 else torch.int32).contiguous()
        g_idx = w_gidx.data if (c.has_g_idx and w_gidx is not None) else None
        p = seam.prepare(packed, scales, zeros, g_idx, bits, c.group_size, c.act_type)
        self.gptq_layout = p.gptq_layout
        for name in (self.w_zp_name, self.w_gidx_name):
            if name and hasattr(layer, name):
                delattr(layer, name)
        seam.attach(layer, p, self.w_q_name, self.w_s_name)

    def apply_weights(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        p = seam.attached(layer, self.gptq_layout, self.w_q_name, self.w_s_name)
        return seam.wna16_mm(
            x, p, bias, self.config.weight_type.size_bits, self.config.group_size
        )
