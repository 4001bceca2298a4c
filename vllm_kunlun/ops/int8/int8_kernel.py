"""``KunlunInt8ScaledMMLinearKernel``: vLLM's int8 ScaledMM kernel on our platforms.

Why: vLLM's W8A8-INT8 schemes (compressed-tensors ``CompressedTensorsW8A8Int8``) ask
``init_int8_linear_kernel`` for a kernel; vLLM 0.15.1 has none for out-of-tree
platforms, and all of its own need ``vllm._C``.
How: after loading, the weight stays ``[out, in]`` int8 (no transpose: both of our
paths take it that way), per-tensor weight scales of fused layers become one scale per
output channel, static activation scales / zero points are folded the way vLLM's
kernels fold them, and the zero-point correction ``azp_adj`` (column sums of the
weight, times the static zero point) is precomputed for asymmetric activations. Every
forward is one call of ``torch.ops.vllm_kunlun.int8_scaled_mm`` (``ops/int8/seam.py``:
vendor kernels on Kunlun, portable torch elsewhere).
Registered by the runtime patch ``kunlun_int8_scaled_mm_kernel``
(``ops/int8/int8_kernel_table_patch.py``). Removal: when vLLM selects a working
int8 kernel for out-of-tree platforms itself.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.quantization.kernels.scaled_mm.ScaledMMLinearKernel import (
    Int8ScaledMMLinearKernel,
    Int8ScaledMMLinearLayerConfig,
)
from vllm.model_executor.layers.quantization.utils import replace_parameter

from vllm_kunlun.ops.int8 import seam as int8_mm


def _param(t: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(t, requires_grad=False)


def fold_static_zero_point(
    input_scale: torch.Tensor, input_zero_point: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One (scale, int32 zero point) covering every shard's static int8 range.

    A fused layer may load one (scale, zero point) per shard; like vLLM's kernels,
    rebuild each shard's float range and take the union. The zero point is rounded
    (vLLM's CPU kernel rounds, its CUDA kernel truncates: rounding is the exact inverse
    when there is one shard).
    """
    azps = input_zero_point.to(torch.int32)
    hi = (input_scale * (127 - azps)).max()
    lo = (input_scale * (-128 - azps)).min()
    scale = (hi - lo) / 255.0
    azp = (-128 - lo / scale).round().to(torch.int32)
    return scale.reshape(()).float(), azp.reshape(())


class KunlunInt8ScaledMMLinearKernel(Int8ScaledMMLinearKernel):
    @classmethod
    def is_supported(
        cls, compute_capability: int | None = None
    ) -> tuple[bool, str | None]:
        from vllm_kunlun.ops.active_platform import active_plugin_platform

        if active_plugin_platform() is not None:
            return True, None
        return False, "requires a vllm-kunlun platform (Kunlun or host emulation)"

    @classmethod
    def can_implement(cls, c: Int8ScaledMMLinearLayerConfig) -> tuple[bool, str | None]:
        return True, None  # per-tensor / per-channel, static / dynamic, azp or not

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        w_name, ws_name, is_name, zp_name, adj_name = self.layer_param_names
        weight = getattr(layer, w_name).data
        replace_parameter(layer, w_name, _param(weight))

        scale = getattr(layer, ws_name).data.float()
        if scale.numel() != weight.shape[0]:  # per tensor (one per fused shard)
            widths = list(getattr(layer, "logical_widths", None) or [weight.shape[0]])
            scale = torch.repeat_interleave(
                scale.reshape(-1), torch.tensor(widths, device=scale.device)
            )
        replace_parameter(layer, ws_name, _param(scale.reshape(-1).contiguous()))

        c = self.config
        zero_point = None
        if c.is_static_input_scheme:
            input_scale = getattr(layer, is_name).data.float()
            if c.input_symmetric:
                replace_parameter(layer, is_name, _param(input_scale.max().reshape(())))
            else:
                s, zero_point = fold_static_zero_point(
                    input_scale, getattr(layer, zp_name).data
                )
                replace_parameter(layer, is_name, _param(s))
                replace_parameter(layer, zp_name, _param(zero_point))
        else:
            setattr(layer, is_name, None)
        if c.input_symmetric:
            setattr(layer, zp_name, None)
            setattr(layer, adj_name, None)
        else:
            adj = weight.sum(dim=1, dtype=torch.int32)
            if zero_point is not None:
                adj = adj * zero_point  # static: the zero point is per tensor
            setattr(layer, adj_name, _param(adj.contiguous()))
        self._op = int8_mm.register_op()

    def apply_weights(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        w, w_s, i_s, i_zp, azp_adj = self._get_layer_params(layer)
        return self._op(x, w, w_s, i_s, i_zp, azp_adj, bias)  # type: ignore[no-any-return]
