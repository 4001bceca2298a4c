"""The portable MLA kernels (vllm_kunlun/ops/mla/portable.py) against multi-head
attention written out in mla_reference.py: DeepSeek's MLA in its un-absorbed form (per-head keys
``[kv_c W_UK, k_pe]`` and values ``kv_c W_UV`` for every token, causal softmax in
float64, one token at a time), the form transformers' model computes."""

from __future__ import annotations

import pytest
import torch

from tests.unit.ops.mla_reference import reference
from vllm_kunlun.ops.mla import portable

GEOMETRIES = [
    # heads, kv_lora_rank L, rope R, nope P, v_head V, block_size
    (4, 32, 16, 16, 24, 16),
    (2, 48, 8, 24, 16, 5),
]


def _model(h: int, lat: int, r: int, p: int, v: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "w_uk": torch.randn(lat, h, p, generator=g) / lat**0.5,
        "w_uv": torch.randn(lat, h, v, generator=g) / lat**0.5,
        "gen": g,
    }


def _cache(blocks: int, block_size: int, width: int) -> torch.Tensor:
    return torch.full((blocks, block_size, width), float("nan"))


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_prefill_over_cached_context_equals_full_attention(geometry: tuple) -> None:
    h, lat, r, p, v, bs = geometry
    m = _model(h, lat, r, p, v, seed=1)
    g, scale = m["gen"], 0.3
    # Two requests: 13 cached tokens + 6 new; no context + 4 new.
    lens = [(13, 6), (0, 4)]
    cache = _cache(16, bs, lat + r)
    tables = [torch.tensor([7, 2, 9, 4, 11]), torch.tensor([3, 1, 5])]
    qs, news, ctx_kv, starts = [], [], [], [0]
    want = []
    for (context, new), table in zip(lens, tables, strict=True):
        kv_c = torch.randn(context + new, lat, generator=g)
        k_pe = torch.randn(context + new, r, generator=g)
        q = torch.randn(new, h, p + r, generator=g)
        slots = (
            table[torch.arange(context + new) // bs] * bs
            + torch.arange(context + new) % bs
        )
        portable.write_latent_cache(kv_c, k_pe, cache, slots)
        want.append(reference(q, kv_c, k_pe, m["w_uk"], m["w_uv"], scale))
        if context:
            rows = portable.gather_latent(cache, table, 0, context)
            assert torch.equal(rows, torch.cat([kv_c[:context], k_pe[:context]], -1))
            c = rows[:, :lat]
            ctx_kv.append(
                (
                    torch.einsum("tl,lhp->thp", c, m["w_uk"]),
                    rows[:, lat:],
                    torch.einsum("tl,lhv->thv", c, m["w_uv"]),
                )
            )
        else:
            ctx_kv.append(None)
        qs.append(q)
        news.append((kv_c[context:], k_pe[context:]))
        starts.append(starts[-1] + new)
    kv_new = torch.cat([n[0] for n in news])
    got = portable.prefill_attention(
        torch.cat(qs),
        torch.einsum("tl,lhp->thp", kv_new, m["w_uk"]),
        torch.cat([n[1] for n in news]),
        torch.einsum("tl,lhv->thv", kv_new, m["w_uv"]),
        starts,
        [c for c, _ in lens],
        ctx_kv,
        scale,
    )
    torch.testing.assert_close(got.double(), torch.cat(want), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_absorbed_decode_equals_full_attention(geometry: tuple) -> None:
    h, lat, r, p, v, bs = geometry
    m = _model(h, lat, r, p, v, seed=2)
    g, scale = m["gen"], 0.25
    seq_lens = [1, 9, 23]
    cache = _cache(20, bs, lat + r)
    # Block 0 (the padding of the short rows) holds NaN: masked positions must not leak.
    table = torch.tensor([[5, 0, 0, 0, 0], [6, 3, 0, 0, 0], [12, 8, 1, 14, 2]])
    q = torch.randn(len(seq_lens), h, p + r, generator=g)
    want = []
    for b, n in enumerate(seq_lens):
        kv_c = torch.randn(n, lat, generator=g)
        k_pe = torch.randn(n, r, generator=g)
        slots = table[b][torch.arange(n) // bs] * bs + torch.arange(n) % bs
        portable.write_latent_cache(kv_c, k_pe, cache, slots)
        want.append(reference(q[b : b + 1], kv_c, k_pe, m["w_uk"], m["w_uv"], scale))
    q_latent = torch.einsum("bhp,lhp->bhl", q[..., :p], m["w_uk"])
    latent = portable.decode_attention(
        q_latent, q[..., p:], cache, table, torch.tensor(seq_lens), lat, scale
    )
    got = torch.einsum("bhl,lhv->bhv", latent, m["w_uv"])
    torch.testing.assert_close(got.double(), torch.cat(want), atol=1e-5, rtol=1e-5)


def test_cache_write_skips_padding_slots() -> None:
    cache = torch.zeros(2, 4, 3)
    kv_c = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    k_pe = torch.tensor([[7.0], [8.0], [9.0]]).unsqueeze(1)  # [T, 1, R] as vLLM passes
    portable.write_latent_cache(kv_c, k_pe, cache, torch.tensor([5, -1, 0]))
    flat = cache.view(-1, 3)
    assert flat[5].tolist() == [1.0, 2.0, 7.0]
    assert flat[0].tolist() == [5.0, 6.0, 9.0]
    assert int((flat != 0).any(dim=1).sum()) == 2
