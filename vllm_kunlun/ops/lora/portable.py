"""Portable torch LoRA kernels: batched shrink and expand over a mixed batch.

Why: vLLM's LoRA layers hand the punica wrapper one batch whose tokens belong to
different adapters (a slot index per token, -1 for none). vLLM's own torch ops gather a
weight matrix per token (``[T, N, r]`` memory in a prefill); its Triton and CUDA
kernels do not run here. These kernels never loop over tokens or adapters in Python
and have static shapes (no host sync, traceable):

- shrink: one matmul of the tokens with every slot's A at once,
  ``x [T, K] @ A_all^T [K, L*r] -> [T, L, r]``, then each token keeps its own slot's
  ``r`` values (a gather); tokens without an adapter get zeros.
- expand: each token's ``[r]`` is placed in its slot's block of a ``[T, L*r]`` matrix
  (zeros elsewhere), one matmul with every slot's B stacked, ``[L*r, N]``.

The cost is ``max_loras`` times the ideal per-token work (``2 * L * r`` flops per
output element against ``K`` for the base layer), bounded and predictable;
docs/kernels.md has the numbers. Removal: when vLLM ships punica kernels for this
platform.
"""

from __future__ import annotations

import torch


def _slots(weights: torch.Tensor) -> torch.Tensor:
    """vLLM's stacked LoRA weights ``[L, 1, out, in]`` (or ``[L, out, in]``) as 3-D."""
    return weights.squeeze(1) if weights.dim() == 4 else weights


def bgmv_shrink(
    x: torch.Tensor, lora_a: torch.Tensor, indices: torch.Tensor, scale: float
) -> torch.Tensor:
    """``scale * x[t] @ A[indices[t]]^T`` per token, zeros where ``indices[t] < 0``.

    ``x`` [T, K]; ``lora_a`` [L, (1,) r, K]; ``indices`` [T] (long). Returns [T, r] in
    float32.
    """
    a = _slots(lora_a)
    slots, rank, k = a.shape
    t = x.shape[0]
    h = torch.matmul(x.to(a.dtype), a.reshape(slots * rank, k).t())
    h = h.view(t, slots, rank).float()
    valid = indices >= 0
    pick = indices.clamp(min=0).view(t, 1, 1).expand(t, 1, rank)
    out = torch.gather(h, 1, pick).squeeze(1)
    return out * (valid.unsqueeze(1).to(out.dtype) * scale)


def bgmv_expand(
    h: torch.Tensor, lora_b: torch.Tensor, indices: torch.Tensor
) -> torch.Tensor:
    """``h[t] @ B[indices[t]]^T`` per token, zeros where ``indices[t] < 0``.

    ``h`` [T, r]; ``lora_b`` [L, (1,) N, r]; ``indices`` [T]. Returns [T, N] in
    ``lora_b``'s dtype.
    """
    b = _slots(lora_b)
    slots, n, rank = b.shape
    t = h.shape[0]
    onehot = torch.zeros(t, slots, dtype=b.dtype, device=h.device)
    valid = indices >= 0
    onehot.scatter_(1, indices.clamp(min=0).view(t, 1), valid.view(t, 1).to(b.dtype))
    placed = (onehot.unsqueeze(2) * h.to(b.dtype).unsqueeze(1)).reshape(t, slots * rank)
    stacked = b.transpose(1, 2).reshape(slots * rank, n)  # [L*r, N]
    return torch.matmul(placed, stacked)
