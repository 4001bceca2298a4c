"""Encoder-only attention in plain torch: bidirectional, over a step's new tokens, no KV
cache.

Why: pooling models built on encoders (BERT, XLM-RoBERTa: BGE-M3 and its kin) run every
attention layer as vLLM's ``EncoderOnlyAttention``: each request attends to all of its
own tokens (no causal mask), and the layer has no KV cache (vLLM gives it a dummy block
table). The portable backend serves these layers with this kernel; the Kunlun backend's
vendor kernels are causal paged kernels, so the platform chooses the portable backend
for encoder layers (logged once with the reason, ``platforms/kunlun.py``).

How: vLLM's encoder-only metadata builder hands the portable builder the step's metadata
with ``causal=False``; ``plan_encoder`` then pads the step's requests into one group
``[requests, longest request]`` of token rows (padding reads a zero row that is dropped),
and ``encoder_attention`` runs full softmax attention per request, GQA included,
straight from the layer's ``query`` / ``key`` / ``value``. Memory is ``requests x
longest^2 x heads`` per layer. vLLM does not chunk encoder-only prompts (a request is
one step), so every request's tokens are all in the step.

Removal: with the portable backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class EncoderPlan:
    """A step's requests padded into one group (tensors on the compute device)."""

    num_actual_tokens: int
    index: torch.Tensor
    """[R, L] token row of each (request, position); padding: the dummy row ``T``."""
    valid: torch.Tensor
    """[R, L] True at a request's own positions."""


def plan_encoder(
    query_start_loc: torch.Tensor, max_query_len: int, num_actual_tokens: int
) -> EncoderPlan:
    """Rows of requests ``query_start_loc[r]:[r+1]`` ([R+1], on the compute device);
    ``max_query_len`` is a host integer (an upper bound is fine)."""
    starts = query_start_loc[:-1].long()
    lens = query_start_loc[1:].long() - starts
    pos = torch.arange(max(max_query_len, 1), device=query_start_loc.device)
    valid = pos[None, :] < lens[:, None]
    index = torch.where(valid, starts[:, None] + pos[None, :], num_actual_tokens)
    return EncoderPlan(num_actual_tokens=num_actual_tokens, index=index, valid=valid)


def encoder_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    plan: EncoderPlan,
    output: torch.Tensor,
    scale: float,
    logits_soft_cap: float | None = None,
) -> torch.Tensor:
    """Fill ``output[:num_actual_tokens]`` ([T, num_heads, head_size]) with each token's
    attention over every token of its request, and return it. ``key`` / ``value`` are
    [T, num_kv_heads, head_size]; float32 math."""
    n = plan.num_actual_tokens
    num_heads, head_size = query.shape[1], query.shape[2]
    num_kv_heads = key.shape[1]

    def rows(t: torch.Tensor) -> torch.Tensor:
        padded = torch.cat([t[:n], t.new_zeros(1, *t.shape[1:])])
        return padded[plan.index].float()  # [R, L, heads, D]

    q, k, v = rows(query), rows(key), rows(value)
    r, length = plan.index.shape
    q = q.view(r, length, num_kv_heads, num_heads // num_kv_heads, head_size)
    scores = torch.einsum("rqkgd,rlkd->rkgql", q, k) * scale
    if logits_soft_cap:
        scores = logits_soft_cap * torch.tanh(scores / logits_soft_cap)
    scores = scores.masked_fill(~plan.valid[:, None, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("rkgql,rlkd->rqkgd", probs, v).reshape(-1, num_heads, head_size)
    result = torch.zeros(
        n + 1, num_heads, head_size, dtype=output.dtype, device=output.device
    )
    result.index_copy_(0, plan.index.reshape(-1), out.to(result.dtype))
    output[:n] = result[:n]
    return output
