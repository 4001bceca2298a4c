"""Fake of ``kunlun_ops``' Gated DeltaNet decode kernel, the one the plugin calls.

``fused_recurrent_gated_delta_rule_fwdv2(q, k, v, g, beta, scale, initial_state, *,
inplace_final_state, cu_seqlens, h0_indices, num_accepted_tokens,
use_qk_l2norm_in_kernel, is_h0_transposed)`` with the semantics the upstream Kunlun
plugin relies on (observed usage, not vendor documentation): varlen ``[1, T, H, K]``
inputs, sequence ``n`` starts from ``initial_state[h0_indices[n]]`` and, in place, ends
there; ``is_h0_transposed=True`` says the state pool is ``[slots, HV, K, V]`` (vLLM's
layout), False that it is ``[slots, HV, V, K]``. Returns ``(o, final_state)``.

The math is transformers' ``torch_recurrent_gated_delta_rule``, one sequence at a time,
so a plugin bug in the arguments (a wrong layout flag, state indices, scale, head
mapping) changes the numbers. Every call is recorded in ``kunlun_ops.CALLS``.
"""

from __future__ import annotations

import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    l2norm,
    torch_recurrent_gated_delta_rule,
)

from kunlun_ops import _record

__all__ = ["fused_recurrent_gated_delta_rule_fwdv2"]


def _require_contiguous(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")


def fused_recurrent_gated_delta_rule_fwdv2(
    q,
    k,
    v,
    g,
    beta,
    scale,
    initial_state,
    inplace_final_state=True,
    cu_seqlens=None,
    h0_indices=None,
    num_accepted_tokens=None,
    use_qk_l2norm_in_kernel=False,
    is_h0_transposed=False,
):
    _require_contiguous(q=q, k=k, v=v, g=g, beta=beta)
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError("with cu_seqlens the batch size must be 1")
    _record(
        "fused_recurrent_gated_delta_rule_fwdv2",
        q=q,
        k=k,
        v=v,
        g=g,
        beta=beta,
        scale=scale,
        initial_state=initial_state,
        inplace_final_state=inplace_final_state,
        cu_seqlens=cu_seqlens,
        h0_indices=h0_indices,
        num_accepted_tokens=num_accepted_tokens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        is_h0_transposed=is_h0_transposed,
    )
    bounds = cu_seqlens.tolist() if cu_seqlens is not None else [0, q.shape[1]]
    repeat = v.shape[2] // q.shape[2]
    o = torch.zeros_like(v)
    finals = []
    for n in range(len(bounds) - 1):
        s, e = bounds[n], bounds[n + 1]
        slot = int(h0_indices[n]) if h0_indices is not None else n
        h0 = initial_state[slot]
        if not is_h0_transposed:
            h0 = h0.transpose(-1, -2)
        q_n, k_n = (t[:, s:e].float().repeat_interleave(repeat, dim=2) for t in (q, k))
        if use_qk_l2norm_in_kernel:
            q_n, k_n = l2norm(q_n), l2norm(k_n)
        # transformers multiplies q by K**-0.5 itself: pre-scale so ``scale`` applies.
        q_n = q_n * (scale * q.shape[-1] ** 0.5)
        out, h = torch_recurrent_gated_delta_rule(
            q_n,
            k_n,
            v[:, s:e],
            g[:, s:e],
            beta[:, s:e],
            initial_state=h0[None].clone(),
            output_final_state=True,
        )
        o[:, s:e] = out
        h = h[0] if is_h0_transposed else h[0].transpose(-1, -2)
        finals.append(h)
        if inplace_final_state:
            initial_state[slot] = h.to(initial_state.dtype)
    final = initial_state if inplace_final_state else torch.stack(finals)
    return o, final
