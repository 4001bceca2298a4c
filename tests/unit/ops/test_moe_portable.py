"""The portable MoE kernels (vllm_kunlun/ops/moe/portable.py) against transformers'
own Qwen3.5-MoE classes: ``Qwen3_5MoeTopKRouter``, ``Qwen3_5MoeExperts`` and the sparse
block, built small with random weights, at several expert counts, widths and token
counts; expert-parallel slices; W8A8 experts against a float64 reference."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.unit.ops.moe_cases import block, inputs, quantize_rows, weights
from vllm_kunlun.ops.int8 import portable as int8_portable
from vllm_kunlun.ops.moe import portable

# (experts, top_k, hidden, expert width, tokens)
SHAPES = [
    (8, 2, 32, 16, 1),
    (8, 2, 32, 16, 7),
    (16, 4, 64, 48, 33),
    (64, 8, 64, 16, 33),
    (64, 8, 32, 48, 7),
]
IDS = [f"E{e}-k{k}-H{h}-I{i}-T{t}" for e, k, h, i, t in SHAPES]


# ---- routing --------------------------------------------------------------------------


@pytest.mark.parametrize(("e", "k", "h", "i", "t"), SHAPES, ids=IDS)
@pytest.mark.parametrize("renormalize", [True, False])
def test_route_equals_transformers_router(
    e: int, k: int, h: int, i: int, t: int, renormalize: bool
) -> None:
    moe = block(e, k, h, i)
    x = inputs(t, h)
    with torch.no_grad():
        probs, scores, ids = moe.gate(x)
        got_w, got_i = portable.route(F.linear(x, moe.gate.weight), k, renormalize)
    # transformers' router always renormalises; without it the weights are the probs
    want = scores if renormalize else probs.gather(1, ids)
    assert got_w.dtype == torch.float32 and got_i.dtype == torch.int64
    assert torch.equal(got_i, ids)
    assert torch.equal(got_w, want)
    if not renormalize and k < e:
        assert bool((got_w.sum(-1) < 1).all())


@pytest.mark.parametrize("renormalize", [True, False])
def test_route_breaks_exact_ties_as_transformers(renormalize: bool) -> None:
    moe = block(16, 4, 32, 16)
    with torch.no_grad():
        # experts 2, 5, 9 and 11 get identical logits for every token, large enough to
        # sit in or straddle the top 4 for many tokens
        moe.gate.weight[[2, 5, 9, 11]] = 3.0 * moe.gate.weight[2]
    x = inputs(40, 32)
    x[:4] = 0.0  # all-zero tokens: every logit ties
    logits = F.linear(x, moe.gate.weight)
    assert bool((logits[:, 2] == logits[:, 9]).all())
    with torch.no_grad():
        probs, scores, ids = moe.gate(x)
    got_w, got_i = portable.route(logits, 4, renormalize)
    tied = torch.isin(got_i, torch.tensor([2, 5, 9, 11])).sum(-1).tolist()
    assert {1, 2, 3} <= set(tied)  # tied groups straddle the top-k boundary
    assert torch.equal(got_i, ids)
    assert torch.equal(got_w, scores if renormalize else probs.gather(1, ids))


# ---- the experts ----------------------------------------------------------------------


@pytest.mark.parametrize(("e", "k", "h", "i", "t"), SHAPES, ids=IDS)
def test_grouped_experts_equal_transformers_experts_float32(
    e: int, k: int, h: int, i: int, t: int
) -> None:
    moe = block(e, k, h, i)
    x = inputs(t, h)
    _, w13, w2 = weights(moe)
    with torch.no_grad():
        _, scores, ids = moe.gate(x)
        want = moe.experts(x, ids, scores)
    got = portable.grouped_experts(x, w13, w2, scores, ids)
    assert got.dtype == torch.float32 and got.shape == (t, h)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("e", "k", "h", "i", "t"), SHAPES[1:4], ids=IDS[1:4])
def test_grouped_experts_equal_transformers_experts_bf16(
    e: int, k: int, h: int, i: int, t: int
) -> None:
    moe = block(e, k, h, i).to(torch.bfloat16)
    x = inputs(t, h).to(torch.bfloat16)
    router, w13, w2 = weights(moe)
    with torch.no_grad():
        _, scores, ids = moe.gate(x)
        want = moe.experts(x, ids, scores)
    got_w, got_i = portable.route(F.linear(x, router), k, True)
    assert torch.equal(got_i, ids) and torch.equal(got_w, scores)
    got = portable.grouped_experts(x, w13, w2, got_w, got_i)
    assert got.dtype == torch.bfloat16
    # bf16 keeps 8 significant bits: a few outputs differ by one ulp of the largest
    scale = want.float().abs().max().item()
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=1e-2 * scale)


@pytest.mark.parametrize(("e", "k", "h", "i", "t"), SHAPES, ids=IDS)
def test_the_sparse_block_is_routed_experts_plus_the_gated_shared_expert(
    e: int, k: int, h: int, i: int, t: int
) -> None:
    """What the model class computes: ``moe_forward`` plus its own shared expert."""
    moe = block(e, k, h, i)
    x = inputs(t, h)
    router, w13, w2 = weights(moe)
    with torch.no_grad():
        want = moe(x.unsqueeze(0)).squeeze(0)
        shared = torch.sigmoid(moe.shared_expert_gate(x)) * moe.shared_expert(x)
    routed = portable.moe_forward(x, router, w13, w2, top_k=k, renormalize=True)
    torch.testing.assert_close(routed + shared, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("slices", [2, 4])
@pytest.mark.parametrize(("e", "k", "h", "i", "t"), SHAPES[1:], ids=IDS[1:])
def test_expert_parallel_slices_sum_to_the_whole(
    e: int, k: int, h: int, i: int, t: int, slices: int
) -> None:
    moe = block(e, k, h, i)
    x = inputs(t, h)
    router, w13, w2 = weights(moe)
    w, ids = portable.route(F.linear(x, router), k, True)
    full = portable.grouped_experts(x, w13, w2, w, ids)
    per = e // slices
    parts = [
        portable.grouped_experts(
            x,
            w13[r * per : (r + 1) * per],
            w2[r * per : (r + 1) * per],
            w,
            ids,
            expert_start=r * per,
        )
        for r in range(slices)
    ]
    torch.testing.assert_close(sum(parts), full, rtol=1e-5, atol=1e-5)
    # a slice no token routed to contributes exact zeros
    idle = ids.max().item() + 1
    if idle < e:
        empty = portable.grouped_experts(
            x, w13[idle:], w2[idle:], w, ids, expert_start=int(idle)
        )
        assert torch.equal(empty, torch.zeros_like(x))


def test_no_tokens() -> None:
    moe = block(8, 2, 32, 16)
    router, w13, w2 = weights(moe)
    x = torch.empty(0, 32)
    out = portable.moe_forward(x, router, w13, w2, top_k=2, renormalize=True)
    assert out.shape == (0, 32)


# ---- W8A8 experts ---------------------------------------------------------------------


def w8a8_reference(
    x: torch.Tensor,
    q13: torch.Tensor,
    s13: torch.Tensor,
    q2: torch.Tensor,
    s2: torch.Tensor,
    w: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:
    """float64, token by token: per-token symmetric activations (absmax / 127, round
    half to even), exact int products, per-channel weight scales."""

    def qlinear(a: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        a = a.double()
        amax = a.abs().max()
        qa = torch.round(a * 127.0 / amax).clamp(-128, 127) if amax > 0 else a * 0
        return (q.double() @ qa) * s.double() * (amax / 127.0)

    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = qlinear(x[t], q13[e], s13[e]).float().chunk(2)
            h = F.silu(gate) * up
            out[t] += float(w[t, j]) * qlinear(h, q2[e], s2[e])
    return out


@pytest.mark.parametrize(("e", "k", "h", "i", "t"), SHAPES, ids=IDS)
def test_int8_experts_equal_a_float64_w8a8_reference(
    e: int, k: int, h: int, i: int, t: int
) -> None:
    moe = block(e, k, h, i)
    x = inputs(t, h)
    router, w13, w2 = weights(moe)
    q13, s13 = quantize_rows(w13)
    q2, s2 = quantize_rows(w2)
    w, ids = portable.route(F.linear(x, router), k, True)
    calls: list[int] = []

    def spy(a: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        calls.append(a.shape[0])
        return int8_portable.int8_linear(a, q, s)

    got = portable.grouped_experts(
        x, q13, q2, w, ids, w13_scale=s13, w2_scale=s2, int8_linear=spy
    )
    want = w8a8_reference(x, q13, s13, q2, s2, w, ids)
    scale = want.abs().max().item()
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4 * scale)
    # one matmul pair per active expert, each on all of that expert's tokens
    active = ids.unique().numel()
    assert len(calls) == 2 * active and sum(calls) == 2 * t * k
    # and W8A8 is close to the float experts (the quantization, not a wiring error)
    with torch.no_grad():
        float_out = moe.experts(x, ids, w)
    torch.testing.assert_close(got, float_out, rtol=0.1, atol=0.1 * scale)


def test_int8_experts_default_to_the_int8_seam_and_take_column_scales(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm_kunlun.ops.int8 import seam as int8_seam

    moe = block(8, 2, 32, 16)
    x = inputs(7, 32)
    router, w13, w2 = weights(moe)
    q13, s13 = quantize_rows(w13)
    q2, s2 = quantize_rows(w2)
    w, ids = portable.route(F.linear(x, router), 2, True)
    explicit = portable.grouped_experts(
        x,
        q13,
        q2,
        w,
        ids,
        w13_scale=s13,
        w2_scale=s2,
        int8_linear=lambda a, q, s: int8_portable.int8_linear(a, q, s),
    )
    # The portable choice for this platform, whatever an earlier test selected (the
    # MoE seam's tests run on KunlunPlatform, whose choice is the vendor fake).
    int8_seam.reset_selection()
    seen: list[Any] = []
    real = int8_seam.select_kernels

    def select(device: Any) -> Any:
        seen.append(device)
        return real(device)

    monkeypatch.setattr(int8_seam, "select_kernels", select)
    # compressed-tensors keeps channel scales as [N, 1]: [E, N, 1] here
    default = portable.grouped_experts(
        x, q13, q2, w, ids, w13_scale=s13.unsqueeze(-1), w2_scale=s2.unsqueeze(-1)
    )
    assert seen == [x.device]
    torch.testing.assert_close(default, explicit, rtol=0, atol=0)


def test_int8_needs_both_scales() -> None:
    moe = block(8, 2, 32, 16)
    x = inputs(3, 32)
    _, w13, w2 = weights(moe)
    w, ids = portable.route(torch.randn(3, 8), 2, True)
    with pytest.raises(ValueError, match="both w13_scale and w2_scale"):
        portable.grouped_experts(x, w13, w2, w, ids, w13_scale=torch.ones(8, 32))
