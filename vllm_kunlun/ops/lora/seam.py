"""The LoRA seam: Kunlun's bgmv kernels, or the portable batched torch kernels.

Why: vLLM's punica kernels are Triton / CUDA; on Kunlun the vendor library ships
gathered LoRA matmuls (``xspeedgate_ops.bgmv_shrink_cluster`` and
``bgmv_expand_cluster``, registered as torch custom ops), elsewhere
``ops/lora/portable.py`` computes the same products in plain torch.

Vendor calls (declared in ``ops/contract.py``; call forms in ``docs/vendor-calls.md``),
positional as upstream passes them: ``bgmv_shrink_cluster(inputs, lora_a_weights,
lora_indices_tensor, output_tensor, scaling)`` and ``bgmv_expand_cluster(inputs,
lora_b_weights, lora_indices_tensor, output_tensor, slice_offset)``. Observed usage pins
the argument order, not every semantic, so the seam asks the least of them: weights as
``[L, out, in]``, indices clamped to valid slots (upstream never passes -1) with the
rows of tokens without an adapter zeroed afterwards, and a zeroed output of exactly the
slice with ``slice_offset`` 0, which gives the same result whether the kernel overwrites
or accumulates. The fake (``tests/fakes/xspeedgate_ops/_lora.py``) implements these
semantics; hardware must confirm the real kernels compute them.

No switch: ``ops/chooser.py`` takes the vendor kernels where the active platform wants
vendor kernels and they load, else portable; the choice is logged once per device.
Both paths run behind two functional torch custom ops (``torch.ops.vllm_kunlun.lora_shrink``,
``torch.ops.vllm_kunlun.lora_expand``), so torch.compile sees opaque nodes. Removal: when vLLM's
punica kernels run on Kunlun.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vllm_kunlun.ops import chooser, vendor
from vllm_kunlun.ops.lora import portable
from vllm_kunlun.ops.plugin_op import PluginOp

VENDOR = chooser.VENDOR
PORTABLE = chooser.PORTABLE
VENDOR_MODULE = "xspeedgate_ops"
SHRINK = "bgmv_shrink_cluster"
EXPAND = "bgmv_expand_cluster"


@dataclass(frozen=True)
class VendorLora:
    shrink: Callable[..., Any]
    expand: Callable[..., Any]


# The LoRA path one device uses, and why: the chooser's own choice, as it comes.
LoraKernels = chooser.Choice[VendorLora]


def load_vendor() -> tuple[VendorLora | None, str]:
    """The two vendor kernels, or None and what is missing."""
    shrink, why_shrink = vendor.function(VENDOR_MODULE, SHRINK)
    expand, why_expand = vendor.function(VENDOR_MODULE, EXPAND)
    if shrink is None or expand is None:
        missing = [w for f, w in ((shrink, why_shrink), (expand, why_expand)) if not f]
        return None, "; ".join(dict.fromkeys(missing))
    return VendorLora(shrink, expand), f"{VENDOR_MODULE}.{SHRINK} / {EXPAND}"


SEAM: chooser.DeviceSeam[VendorLora, LoraKernels] = chooser.DeviceSeam(
    chooser.LORA, load_vendor, lambda c: c
)
select_kernels = SEAM.select  # the LoRA path for tensors on a device, chosen once
reset = SEAM.reset
served = SEAM.served  # each path the LoRA kernels ran on here, with call counts


def _slots(weights: torch.Tensor) -> torch.Tensor:
    return (weights.squeeze(1) if weights.dim() == 4 else weights).contiguous()


def shrink_eager(
    x: torch.Tensor, lora_a: torch.Tensor, indices: torch.Tensor, scale: float
) -> torch.Tensor:
    """[T, r] float32: ``scale * x @ A[slot]^T`` per token, zero without an adapter."""
    kernels = select_kernels(x.device)
    SEAM.record(x.device, kernels.name, kernels.reason)
    if kernels.vendor is None:
        return portable.bgmv_shrink(x, lora_a, indices, scale)
    a = _slots(lora_a)
    out = torch.zeros(x.shape[0], a.shape[1], dtype=torch.float32, device=x.device)
    kernels.vendor.shrink(
        x.to(a.dtype).contiguous(), a, indices.clamp(min=0), out, float(scale)
    )
    return out * (indices >= 0).unsqueeze(1).to(out.dtype)


def expand_eager(
    h: torch.Tensor, lora_b: torch.Tensor, indices: torch.Tensor
) -> torch.Tensor:
    """[T, N] in B's dtype: ``h @ B[slot]^T`` per token, zero without an adapter."""
    kernels = select_kernels(h.device)
    SEAM.record(h.device, kernels.name, kernels.reason)
    if kernels.vendor is None:
        return portable.bgmv_expand(h, lora_b, indices)
    b = _slots(lora_b)
    valid = (indices >= 0).unsqueeze(1)
    h = (h * valid.to(h.dtype)).to(b.dtype).contiguous()
    out = torch.zeros(h.shape[0], b.shape[1], dtype=b.dtype, device=h.device)
    kernels.vendor.expand(h, b, indices.clamp(min=0), out, 0)
    return out


def _shrink_fake(
    x: torch.Tensor, lora_a: torch.Tensor, indices: torch.Tensor, scale: float
) -> torch.Tensor:
    return x.new_empty((x.shape[0], lora_a.shape[-2]), dtype=torch.float32)


def _expand_fake(
    h: torch.Tensor, lora_b: torch.Tensor, indices: torch.Tensor
) -> torch.Tensor:
    return h.new_empty((h.shape[0], lora_b.shape[-2]), dtype=lora_b.dtype)


_SHRINK_OP = PluginOp(
    "lora_shrink(Tensor x, Tensor lora_a, Tensor indices, float scale) -> Tensor",
    shrink_eager,
    _shrink_fake,
)
_EXPAND_OP = PluginOp(
    "lora_expand(Tensor h, Tensor lora_b, Tensor indices) -> Tensor",
    expand_eager,
    _expand_fake,
)


def lora_shrink(
    x: torch.Tensor, lora_a: torch.Tensor, indices: torch.Tensor, scale: float
) -> torch.Tensor:
    """``x`` [T, K], ``lora_a`` [L, (1,) r, K], ``indices`` [T] -> [T, r] float32."""
    return _SHRINK_OP.get()(x, lora_a, indices, float(scale))  # type: ignore[no-any-return]


def lora_expand(
    h: torch.Tensor, lora_b: torch.Tensor, indices: torch.Tensor
) -> torch.Tensor:
    """``h`` [T, r], ``lora_b`` [L, (1,) N, r], ``indices`` [T] -> [T, N]."""
    return _EXPAND_OP.get()(h, lora_b, indices)  # type: ignore[no-any-return]
