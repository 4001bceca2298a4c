"""Fake ``torch.ops.xspeedgate_ops.gptq_gemm`` with vLLM's ``_C`` GPTQ semantics.

``gptq_gemm(a, b_q_weight, b_gptq_qzeros, b_gptq_scales, b_g_idx, use_exllama, bit)``
(the argument order the upstream Kunlun plugin passes): ``b_q_weight`` ``[K / f, N]``
int32 with ``f = 32 / bit`` values per word packed along K (first value in the lowest
bits), ``b_gptq_qzeros`` ``[G, N / f]`` packed along N holding ``zero - 1`` (GPTQ v1: the
kernel adds 1), ``b_gptq_scales`` ``[G, N]``, ``b_g_idx`` ``[K]`` the group of each input
row. Only ``use_exllama=False`` (no ``gptq_shuffle``d weight) is modelled. Computed
here in float64 from the bits, independently of the plugin's portable kernel; returns
``[M, N]`` in ``a``'s dtype.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

CALLS: list[tuple[str, dict[str, Any]]] = []

_SCHEMA = (
    "gptq_gemm(Tensor a, Tensor b_q_weight, Tensor b_gptq_qzeros, "
    "Tensor b_gptq_scales, Tensor b_g_idx, bool use_exllama, int bit) -> Tensor"
)


def reset() -> None:
    CALLS.clear()


def _unpack(words: torch.Tensor, bit: int, dim: int) -> torch.Tensor:
    f = 32 // bit
    w = words.long() & 0xFFFFFFFF
    parts = [(w >> (bit * i)) & ((1 << bit) - 1) for i in range(f)]
    stacked = torch.stack(parts, dim=dim + 1)  # value i of each word next to it
    shape = list(words.shape)
    shape[dim] *= f
    return stacked.reshape(shape)


def gptq_gemm(a, b_q_weight, b_gptq_qzeros, b_gptq_scales, b_g_idx, use_exllama, bit):
    assert not use_exllama, "the fake models the non-exllama (g_idx) kernel only"
    assert b_q_weight.dtype == torch.int32 and b_gptq_qzeros.dtype == torch.int32
    CALLS.append(("gptq_gemm", {"m": a.shape[0], "bit": bit}))
    q = _unpack(b_q_weight, bit, 0)  # [K, N]
    zeros = _unpack(b_gptq_qzeros, bit, 1) + 1  # [G, N]
    g = b_g_idx.long()
    w = (q - zeros[g]).double() * b_gptq_scales.double()[g]
    return (a.double() @ w).to(a.dtype)


def _call(*args: Any) -> torch.Tensor:
    return sys.modules[__name__].gptq_gemm(*args)  # type: ignore[no-any-return]


if not hasattr(torch.ops.xspeedgate_ops, "gptq_gemm"):
    _LIB = torch.library.Library("xspeedgate_ops", "FRAGMENT")
    _LIB.define(_SCHEMA)
    _LIB.impl("gptq_gemm", _call, "CompositeExplicitAutograd")
