"""Portable MoE: softmax top-k routing and grouped expert MLPs in plain torch.

Why: vLLM 0.15.1's fused MoE kernels are Triton or ``vllm._C`` kernels, neither of which
runs on torch 2.5.1 without a driver. On Kunlun one vendor call can serve the whole
routed block (``ops/moe/seam.py``); this module serves it everywhere else (host
emulation, CI, int8 experts, expert parallelism) and is the reference the vendor path
is tested against.

Semantics: transformers 5.2.0's ``Qwen3_5MoeTopKRouter`` and ``Qwen3_5MoeExperts``
(docs/kernels.md, "MoE"):

- routing: ``softmax(logits, float32)``, ``torch.topk`` (ties broken as torch breaks
  them), optionally renormalised so each token's weights sum to 1;
- expert ``e``: ``gate, up = (x @ w13[e].T).chunk(2)``, ``h = silu(gate) * up``,
  ``y = h @ w2[e].T``; ``y * weight`` (the float32 weight promotes), cast to ``x``'s
  dtype and added into the output, experts in increasing id order per token.

How (``grouped_experts``): the (token, slot) pairs are flattened, the pairs routed to
this rank's experts kept, sorted by expert (stable), and each active expert runs one
matmul pair on its contiguous slice; one ``index_add_`` writes all contributions. The
only Python loop is over the experts some token chose, never over tokens.
Removal: when vLLM's fused MoE runs on the validated torch without Triton.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

Int8Linear = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# gate_up [n, 2I] -> h [n, I]; the default is SwiGLU's silu(gate) * up.
GatedAct = Callable[[torch.Tensor], torch.Tensor]


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def route(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``router_logits`` [T, E] -> (float32 weights [T, k], int64 expert ids [T, k]),
    exactly as ``Qwen3_5MoeTopKRouter`` computes them (it always renormalises)."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def _default_int8_linear(device: torch.device) -> Int8Linear:
    from vllm_kunlun.ops.int8 import seam as int8_seam

    kernels = int8_seam.select_kernels(device)
    return lambda x, w, s: kernels.linear(x, w, s)


def _channel_scales(scale: torch.Tensor, experts: int, name: str) -> torch.Tensor:
    """[E, N] or [E, N, 1] (compressed-tensors' channel layout) -> [E, N] float32;
    the int8 kernels take one scale per output channel in any shape of N elements."""
    if scale.shape[0] != experts:
        raise ValueError(
            f"{name} has {scale.shape[0]} experts, the weights have {experts}"
        )
    return scale.reshape(experts, -1).to(torch.float32)


def grouped_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    expert_start: int = 0,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    int8_linear: Int8Linear | None = None,
    act: GatedAct = silu_and_mul,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    weight_on_input: bool = False,
) -> torch.Tensor:
    """The routed experts' output [T, H] in ``x``'s dtype.

    ``x`` [T, H]; ``w13`` [E_local, 2I, H] (gate rows, then up rows); ``w2``
    [E_local, H, I]; ``topk_weights`` float32 and ``topk_ids`` (global expert ids)
    [T, k]. This rank holds experts ``expert_start .. expert_start + E_local - 1``;
    pairs routed elsewhere contribute nothing (the caller all-reduces over the expert
    parallel group). With ``w13_scale`` [E_local, 2I] and ``w2_scale`` [E_local, H]
    the weights are int8 (W8A8: symmetric per-channel weight scales, dynamic per-token
    activations) and each matmul is ``int8_linear(x_slice, w[e], scale[e])``, by
    default the int8 seam's kernel for ``x``'s device. ``act`` maps gate_up to the
    expert's hidden activation (default SwiGLU); ``w13_bias`` [E_local, 2I] and
    ``w2_bias`` [E_local, H] are added after their matmuls; ``weight_on_input``
    scales each expert's input by its routing weight instead of its output.
    """
    if x.dim() != 2:
        raise ValueError(f"grouped_experts takes x as [T, H], got {tuple(x.shape)}")
    quantized = w13_scale is not None or w2_scale is not None
    if quantized and (w13_scale is None or w2_scale is None):
        raise ValueError("int8 experts need both w13_scale and w2_scale")
    local_experts = w13.shape[0]
    out = torch.zeros_like(x)
    k = topk_ids.shape[-1]
    local = topk_ids.reshape(-1) - expert_start
    pairs = ((local >= 0) & (local < local_experts)).nonzero().squeeze(1)
    if pairs.numel() == 0:
        return out
    order = torch.argsort(local[pairs], stable=True)
    pairs = pairs[order]
    experts, counts = torch.unique_consecutive(local[pairs], return_counts=True)
    tokens = pairs // k
    weights = topk_weights.reshape(-1)[pairs].unsqueeze(1)
    xs = x[tokens]
    ys = torch.empty_like(xs)
    if quantized:
        assert w13_scale is not None and w2_scale is not None
        s13 = _channel_scales(w13_scale, local_experts, "w13_scale")
        s2 = _channel_scales(w2_scale, local_experts, "w2_scale")
        linear = int8_linear or _default_int8_linear(x.device)
    start = 0
    for e, n in zip(experts.tolist(), counts.tolist(), strict=True):
        rows = slice(start, start + n)
        start += n
        xe = xs[rows]
        if weight_on_input:
            xe = (xe * weights[rows]).to(x.dtype)
        gate_up = linear(xe, w13[e], s13[e]) if quantized else F.linear(xe, w13[e])
        if w13_bias is not None:
            gate_up = gate_up + w13_bias[e]
        h = act(gate_up)
        y = linear(h, w2[e], s2[e]) if quantized else F.linear(h, w2[e])
        if w2_bias is not None:
            y = y + w2_bias[e]
        ys[rows] = (y if weight_on_input else y * weights[rows]).to(x.dtype)
    return out.index_add_(0, tokens, ys)


def moe_forward(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    *,
    top_k: int,
    renormalize: bool,
    expert_start: int = 0,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    int8_linear: Int8Linear | None = None,
) -> torch.Tensor:
    """The routed block in plain torch: router logits in ``x``'s dtype (``F.linear``),
    ``route``, ``grouped_experts``. ``x`` [..., H] -> [..., H]."""
    x2 = x.reshape(-1, x.shape[-1])
    weights, ids = route(F.linear(x2, router_weight), top_k, renormalize)
    out = grouped_experts(
        x2,
        w13,
        w2,
        weights,
        ids,
        expert_start=expert_start,
        w13_scale=w13_scale,
        w2_scale=w2_scale,
        int8_linear=int8_linear,
    )
    return out.reshape(x.shape)
