"""The portable paged attention (plain torch) against naive dense attention.

Random batches mix decodes, prefill chunks over cached context (chunked prefill, prefix
cache hits) and fresh prefills, with GQA, shuffled physical blocks and padded slots. The
reference attends over each request's whole sequence, kept outside the cache, masking
by hand (causal, the sliding window ``p - window < j <= p``), with the soft cap and the
sinks (one extra logit per head in the softmax, as transformers' gpt-oss writes it).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from vllm_kunlun.ops.attention import paged_portable as paged

CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.device,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    ],
)


@dataclass
class Batch:
    query: torch.Tensor  # [T, H, D] new tokens' queries
    key: torch.Tensor  # [T, KH, D] new tokens' keys
    value: torch.Tensor
    kv_cache: torch.Tensor  # context already written
    plan: paged.AttentionPlan
    full_k: list[torch.Tensor]  # per request [S, KH, D] (context + new)
    full_v: list[torch.Tensor]
    q_ranges: list[tuple[int, int]]  # token rows of each request
    context_lens: list[int]


def make_batch(
    context_lens: list[int],
    query_lens: list[int],
    *,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_size: int = 16,
    block_size: int = 4,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    pad_tokens: int = 0,
    seed: int = 0,
) -> Batch:
    """Requests with ``query_lens == 1`` must come first (vLLM's decode-first order)."""
    gen = torch.Generator().manual_seed(seed)
    num_reqs = len(context_lens)
    seq_lens = [c + q for c, q in zip(context_lens, query_lens, strict=True)]
    blocks_per_req = [-(-s // block_size) for s in seq_lens]
    max_blocks = max(blocks_per_req)
    num_blocks = sum(blocks_per_req) + 3  # spare blocks stay untouched
    physical = torch.randperm(num_blocks, generator=gen).tolist()
    block_table = torch.zeros(num_reqs, max_blocks, dtype=torch.int32)
    for r, n in enumerate(blocks_per_req):
        block_table[r, :n] = torch.tensor([physical.pop() for _ in range(n)])

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    kv_cache = torch.zeros(
        num_blocks, 2, block_size, num_kv_heads, head_size, dtype=dtype
    )
    full_k, full_v, queries, keys, values, slots = [], [], [], [], [], []
    for r, (ctx, s) in enumerate(zip(context_lens, seq_lens, strict=True)):
        k, v = rand(s, num_kv_heads, head_size), rand(s, num_kv_heads, head_size)
        full_k.append(k)
        full_v.append(v)
        pos = torch.arange(s)
        req_slots = (
            block_table[r, pos // block_size].long() * block_size + pos % block_size
        )
        # The context was written by earlier steps (or is a prefix-cache hit).
        paged.write_kv_cache(k[:ctx], v[:ctx], kv_cache, req_slots[:ctx])
        queries.append(rand(s - ctx, num_heads, head_size))
        keys.append(k[ctx:])
        values.append(v[ctx:])
        slots.append(req_slots[ctx:])
    query = torch.cat([*queries, rand(pad_tokens, num_heads, head_size)])
    key = torch.cat([*keys, rand(pad_tokens, num_kv_heads, head_size)])
    value = torch.cat([*values, rand(pad_tokens, num_kv_heads, head_size)])
    slot_mapping = torch.cat([*slots, torch.full((pad_tokens,), -1)])
    qsl = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    num_tokens = int(qsl[-1])
    num_decodes = next((i for i, q in enumerate(query_lens) if q != 1), num_reqs)
    plan = paged.plan_step(
        qsl.to(device),
        qsl,
        torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_table.to(device),
        slot_mapping.to(device),
        num_decodes=num_decodes,
        num_actual_tokens=num_tokens,
        max_seq_len=max(seq_lens),
        block_size=block_size,
    )
    return Batch(
        query=query.to(device),
        key=key.to(device),
        value=value.to(device),
        kv_cache=kv_cache.to(device),
        plan=plan,
        full_k=full_k,
        full_v=full_v,
        q_ranges=[(int(qsl[i]), int(qsl[i + 1])) for i in range(num_reqs)],
        context_lens=list(context_lens),
    )


def naive_attention(
    batch: Batch,
    scale: float,
    soft_cap: float | None = None,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dense causal GQA attention per request, in float64."""
    num_heads = batch.query.shape[1]
    out = torch.zeros(batch.query.shape, dtype=torch.float64)
    for (lo, hi), ctx, k, v in zip(
        batch.q_ranges, batch.context_lens, batch.full_k, batch.full_v, strict=True
    ):
        q = batch.query[lo:hi].cpu().double()  # [Q, H, D]
        group = num_heads // k.shape[1]
        k = k.double().repeat_interleave(group, dim=1)  # [S, H, D]
        v = v.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,shd->hqs", q, k) * scale
        if soft_cap:
            scores = soft_cap * torch.tanh(scores / soft_cap)
        q_pos = ctx + torch.arange(hi - lo)
        k_pos = torch.arange(k.shape[0])[None, :]
        allowed = k_pos <= q_pos[:, None]
        if window is not None:
            allowed &= k_pos > q_pos[:, None] - window
        scores = scores.masked_fill(~allowed, float("-inf"))
        if sinks is None:
            probs = scores.softmax(-1)
        else:
            sink = sinks.double()[:, None, None].expand(-1, hi - lo, 1)
            probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
        out[lo:hi] = torch.einsum("hqs,shd->qhd", probs, v)
    return out


def run(
    batch: Batch,
    scale: float,
    soft_cap: float | None = None,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    paged.write_kv_cache(
        batch.key, batch.value, batch.kv_cache, batch.plan.slot_mapping
    )
    output = torch.full_like(batch.query, float("nan"))
    return paged.attend(
        batch.query,
        batch.kv_cache[:, 0],
        batch.kv_cache[:, 1],
        batch.plan,
        output,
        scale,
        soft_cap,
        window=window,
        sinks=None if sinks is None else sinks.to(batch.query.device),
    )


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("seed", range(4))
def test_mixed_batch_matches_naive_attention(device: str, seed: int) -> None:
    # 3 decodes over long contexts, a prefill chunk over cached context, a fresh
    # prefill, and a chunk that does not end on a block boundary.
    context_lens = [9, 1, 30, 12, 0, 5]
    query_lens = [1, 1, 1, 7, 11, 3]
    batch = make_batch(context_lens, query_lens, device=device, seed=seed, pad_tokens=2)
    scale = 16**-0.5
    out = run(batch, scale)
    n = batch.plan.num_actual_tokens
    torch.testing.assert_close(
        out[:n].cpu().double(), naive_attention(batch, scale)[:n], atol=1e-5, rtol=1e-5
    )
    # Rows past num_actual_tokens (padding) are left alone.
    assert torch.isnan(out[n:]).all()


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_decode_only_and_prefill_only_batches(device: str) -> None:
    scale = 0.3
    for ctx, q in (([4, 17, 2], [1, 1, 1]), ([0, 6], [13, 4])):
        batch = make_batch(ctx, q, num_heads=6, num_kv_heads=3, device=device)
        out = run(batch, scale)
        torch.testing.assert_close(
            out.cpu().double(), naive_attention(batch, scale), atol=1e-5, rtol=1e-5
        )


def test_multi_query_attention_and_soft_cap() -> None:
    batch = make_batch([3, 0], [1, 9], num_heads=8, num_kv_heads=1, head_size=8)
    out = run(batch, scale=1.0, soft_cap=2.0)
    expected = naive_attention(batch, scale=1.0, soft_cap=2.0)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    # The cap changes the result: the test would notice a backend ignoring it.
    assert not torch.allclose(
        out.double(), naive_attention(batch, scale=1.0), atol=1e-3
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_cache(dtype: torch.dtype) -> None:
    batch = make_batch([6, 0], [1, 10], dtype=dtype)
    out = run(batch, scale=0.25)
    assert out.dtype == dtype
    torch.testing.assert_close(
        out.double(), naive_attention(batch, scale=0.25), atol=2e-2, rtol=2e-2
    )


def test_cache_write_by_slot_mapping_skips_padding() -> None:
    kv_cache = torch.zeros(3, 2, 4, 1, 2)
    key = torch.arange(6.0).view(3, 1, 2)
    value = -key
    paged.write_kv_cache(key, value, kv_cache, torch.tensor([9, -1, 2]))
    # slot 9 = block 2, offset 1; slot 2 = block 0, offset 2; -1 is padding.
    assert kv_cache[2, 0, 1].tolist() == [[0.0, 1.0]]
    assert kv_cache[2, 1, 1].tolist() == [[-0.0, -1.0]]
    assert kv_cache[0, 0, 2].tolist() == [[4.0, 5.0]]
    assert kv_cache[0, 1, 2].tolist() == [[-4.0, -5.0]]
    # Nothing else was written: the padded row's key [2, 3] appears nowhere.
    assert int((kv_cache != 0).sum()) == 6
    assert not ((kv_cache == 2) | (kv_cache == 3)).any()


def test_attention_reads_only_its_own_blocks() -> None:
    batch = make_batch([8, 8], [1, 1], seed=3)
    scale = 0.25
    out_before = run(batch, scale).clone()
    # Scribble over every block request 1 does not own: request 0 must not change.
    owned = set(batch.plan.groups[0].kv_block[0].tolist())
    for b in range(batch.kv_cache.shape[0]):
        if b not in owned:
            batch.kv_cache[b] = 1e4
    out_after = paged.attend(
        batch.query,
        batch.kv_cache[:, 0],
        batch.kv_cache[:, 1],
        batch.plan,
        torch.empty_like(batch.query),
        scale,
    )
    torch.testing.assert_close(out_after[0], out_before[0])
    assert not torch.allclose(out_after[1], out_before[1])


# ---- sliding windows, sinks, soft-cap --------------------------------------------------
# Decodes over contexts longer and shorter than the windows, a chunk over cached context,
# a fresh prefill, a chunk ending mid-block.
WINDOW_BATCH = ([9, 1, 30, 12, 0, 5], [1, 1, 1, 7, 11, 3])


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("window", [1, 3, 8, 16, 200])
@pytest.mark.parametrize("block_size", [4, 16])
def test_sliding_window_matches_masked_dense_attention(
    device: str, window: int, block_size: int
) -> None:
    batch = make_batch(
        *WINDOW_BATCH, device=device, block_size=block_size, seed=window, pad_tokens=2
    )
    scale = 16**-0.5
    out = run(batch, scale, window=window)
    n = batch.plan.num_actual_tokens
    expected = naive_attention(batch, scale, window=window)
    torch.testing.assert_close(
        out[:n].cpu().double(), expected[:n], atol=1e-5, rtol=1e-5
    )
    if window < 30:  # shorter than some context: ignoring it would be noticed
        assert not torch.allclose(
            expected[:n], naive_attention(batch, scale)[:n], atol=1e-3
        )


def test_window_larger_than_every_sequence_is_full_attention() -> None:
    batch = make_batch(*WINDOW_BATCH, seed=5)
    out = run(batch, 0.25, window=4096)
    torch.testing.assert_close(
        out.double(), naive_attention(batch, 0.25), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("window", [2, 6])
def test_window_reads_no_block_the_sliding_window_manager_may_free(
    window: int,
) -> None:
    """vLLM's sliding-window KV manager frees (and reuses) the blocks wholly before
    ``num_computed_tokens - window + 1``: poisoning them must change nothing."""
    context_lens, query_lens = [13, 22, 17], [1, 1, 5]
    block_size = 4
    batch = make_batch(context_lens, query_lens, block_size=block_size, seed=9)
    scale = 0.25
    before = run(batch, scale, window=window).clone()
    table = [g.block_table for g in batch.plan.groups]
    rows = [(0, r) for r in range(2)] + [(1, 0)]
    for (g, r), ctx in zip(rows, context_lens, strict=True):
        first_kept = max(0, ctx - window + 1)
        for col in range(first_kept // block_size):  # blocks wholly before it
            batch.kv_cache[int(table[g][r, col])] = float("nan")
    output = torch.full_like(batch.query, float("nan"))
    after = paged.attend(
        batch.query,
        batch.kv_cache[:, 0],
        batch.kv_cache[:, 1],
        batch.plan,
        output,
        scale,
        window=window,
    )
    assert torch.isfinite(after).all()
    torch.testing.assert_close(after, before)
    # Full attention reads those blocks: the poison shows (the check has teeth).
    full = paged.attend(
        batch.query,
        batch.kv_cache[:, 0],
        batch.kv_cache[:, 1],
        batch.plan,
        torch.empty_like(output),
        scale,
    )
    assert not torch.isfinite(full).all()


@pytest.mark.parametrize("heads", [(4, 2), (8, 1)])
def test_sinks_join_the_softmax_denominator(heads: tuple[int, int]) -> None:
    num_heads, num_kv_heads = heads
    batch = make_batch(
        *WINDOW_BATCH, num_heads=num_heads, num_kv_heads=num_kv_heads, seed=2
    )
    sinks = torch.linspace(-1.0, 3.0, num_heads)
    out = run(batch, 0.25, sinks=sinks)
    expected = naive_attention(batch, 0.25, sinks=sinks)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(expected, naive_attention(batch, 0.25), atol=1e-3)


def test_sinks_window_and_soft_cap_together_with_gqa() -> None:
    # gpt-oss: sinks on every layer, a window on every other one; Gemma 2: cap + window.
    batch = make_batch(*WINDOW_BATCH, num_heads=6, num_kv_heads=2, seed=4)
    sinks = torch.tensor([0.5, -2.0, 1.0, 0.0, 2.5, -0.5])
    out = run(batch, 0.3, soft_cap=1.5, window=5, sinks=sinks)
    expected = naive_attention(batch, 0.3, soft_cap=1.5, window=5, sinks=sinks)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_bfloat16_window_and_sinks() -> None:
    batch = make_batch(*WINDOW_BATCH, dtype=torch.bfloat16, seed=6)
    sinks = torch.linspace(-1.0, 1.0, 4).to(torch.bfloat16)
    out = run(batch, 0.25, window=7, sinks=sinks)
    expected = naive_attention(batch, 0.25, window=7, sinks=sinks)
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)


def test_window_views_are_planned_once_per_step_and_window() -> None:
    batch = make_batch(*WINDOW_BATCH, seed=1)
    group = batch.plan.groups[-1]
    assert group.view(4) is group.view(4)
    assert group.view(4) is not group.view(5)
    # A window as long as the longest sequence needs no view of its own.
    assert group.view(group.max_seq_len).mask is group.mask


LAYER_FEATURES = [
    {"sliding_window": 3},
    {"logits_soft_cap": 1.5},
    {"sinks": torch.linspace(-1.0, 2.0, 4)},
    {"sliding_window": 5, "logits_soft_cap": 2.0, "sinks": torch.ones(4)},
]


@pytest.mark.parametrize("features", LAYER_FEATURES)
def test_the_backend_layer_hands_its_window_cap_and_sinks_to_the_kernel(
    features: dict,
) -> None:
    """vLLM builds each layer's impl with its window, cap and sinks, then calls
    ``forward``: a layer that dropped one on the way to the kernel would attend like
    full attention here (the check against plain attention below proves it would show)."""
    from vllm_kunlun.ops.attention.backend import (
        PortableAttentionImpl,
        PortableAttentionMetadata,
    )

    batch = make_batch(*WINDOW_BATCH, seed=11)
    scale = 16**-0.5
    layer = PortableAttentionImpl(4, 16, scale, 2, **features)
    meta = PortableAttentionMetadata(
        num_actual_tokens=batch.plan.num_actual_tokens,
        max_query_len=0,
        max_seq_len=0,
        query_start_loc=torch.zeros(0),
        seq_lens=torch.zeros(0),
        block_table=torch.zeros(0),
        slot_mapping=batch.plan.slot_mapping,
        plan=batch.plan,
    )
    output = torch.full_like(batch.query, float("nan"))
    layer.forward(
        None,  # type: ignore[arg-type]
        batch.query,
        batch.key,
        batch.value,
        batch.kv_cache,
        meta,
        output=output,
    )
    expected = naive_attention(
        batch,
        scale,
        soft_cap=features.get("logits_soft_cap"),
        window=features.get("sliding_window"),
        sinks=features.get("sinks"),
    )
    torch.testing.assert_close(output.double(), expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(expected, naive_attention(batch, scale), atol=1e-3)
