"""The MLA backend (vllm_kunlun/ops/mla/backend.py) as vLLM drives it, without an
engine: one step planned from vLLM's ``CommonAttentionMetadata`` (decodes first, then
prefills with cached context: a prefix hit or an earlier chunk), ``forward`` with vLLM's
inputs (``q`` with rope applied, ``kv_c_normed``, ``k_pe`` ``[T, 1, R]``) after vLLM's
weight split (``MLACommonBaseImpl.process_weights_after_loading``), against multi-head
attention written out in float64 (``mla_reference.reference``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from vllm.v1.attention.backend import AttentionType, CommonAttentionMetadata

from tests.unit.ops.mla_reference import reference
from vllm_kunlun.ops.mla import portable, seam
from vllm_kunlun.ops.mla.backend import PluginMLAImpl
from vllm_kunlun.ops.mla.metadata import build_metadata


class KvBProj(torch.nn.Module):
    """vLLM's ``kv_b_proj`` as the impl uses it: ``.weight`` ``[H * (P + V), L]``,
    no quantization, called as ``(out, bias)``."""

    quant_method = None

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return x @ self.weight.t(), None


def _impl(h: int, lat: int, r: int, p: int, v: int, g: torch.Generator) -> Any:
    w = torch.randn(h * (p + v), lat, generator=g) / lat**0.5
    impl = PluginMLAImpl(
        num_heads=h,
        head_size=lat + r,
        scale=(p + r) ** -0.5,
        num_kv_heads=1,
        alibi_slopes=None,
        sliding_window=None,
        kv_cache_dtype="auto",
        logits_soft_cap=None,
        attn_type=AttentionType.DECODER,
        kv_sharing_target_layer_name=None,
        q_lora_rank=None,
        kv_lora_rank=lat,
        qk_nope_head_dim=p,
        qk_rope_head_dim=r,
        qk_head_dim=p + r,
        v_head_dim=v,
        kv_b_proj=KvBProj(w),
        indexer=None,
    )
    impl.process_weights_after_loading(torch.float32)
    per_head = w.view(h, p + v, lat)
    w_uk = per_head[:, :p].permute(2, 0, 1)  # [L, H, P]
    w_uv = per_head[:, p:].permute(2, 0, 1)  # [L, H, V]
    return impl, w_uk, w_uv


@pytest.fixture(autouse=True)
def fresh() -> Any:
    seam.reset()
    yield
    seam.reset()


@pytest.mark.parametrize(
    "geometry,block_size",
    [((4, 32, 16, 16, 24), 16), ((2, 48, 8, 24, 16), 5)],
)
def test_a_mixed_step_equals_full_attention(geometry: tuple, block_size: int) -> None:
    h, lat, r, p, v = geometry
    g = torch.Generator().manual_seed(lat)
    impl, w_uk, w_uv = _impl(h, lat, r, p, v, g)
    # (context already cached, new tokens): two decodes, then a prefill with a prefix
    # hit / an earlier chunk, then a fresh prefill.
    requests = [(9, 1), (20, 1), (13, 7), (0, 5)]
    blocks = 40
    cache = torch.zeros(blocks, block_size, lat + r)
    perm = torch.randperm(blocks, generator=g)
    per = -(-max(c + n for c, n in requests) // block_size)
    table = torch.stack([perm[i * per : (i + 1) * per] for i in range(len(requests))])
    qs, kv_cs, k_pes, slots, want = [], [], [], [], []
    for i, (context, new) in enumerate(requests):
        kv_c = torch.randn(context + new, lat, generator=g)
        k_pe = torch.randn(context + new, r, generator=g)
        q = torch.randn(new, h, p + r, generator=g)
        pos = torch.arange(context + new)
        row_slots = table[i][pos // block_size] * block_size + pos % block_size
        # The context is in the cache from earlier steps; the new tokens are written
        # by this step's forward.
        portable.write_latent_cache(kv_c[:context], k_pe[:context], cache, row_slots)
        want.append(reference(q, kv_c, k_pe, w_uk, w_uv, impl.scale))
        qs.append(q)
        kv_cs.append(kv_c[context:])
        k_pes.append(k_pe[context:])
        slots.append(row_slots[context:])
    q_loc = torch.tensor([0, *torch.tensor([n for _, n in requests]).cumsum(0)])
    seq_lens = torch.tensor([c + n for c, n in requests], dtype=torch.int32)
    tokens = int(q_loc[-1])
    common = CommonAttentionMetadata(
        query_start_loc=q_loc.to(torch.int32),
        query_start_loc_cpu=q_loc.to(torch.int32),
        seq_lens=seq_lens,
        num_reqs=len(requests),
        num_actual_tokens=tokens,
        max_query_len=7,
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=table.to(torch.int32),
        slot_mapping=torch.cat(slots).to(torch.int64),
    )
    meta = build_metadata(common)
    assert (meta.num_decodes, meta.num_decode_tokens, meta.num_prefills) == (2, 2, 2)
    assert meta.prefill is not None and meta.prefill.context_lens == [13, 0]
    assert meta.prefill.query_start_loc == [0, 7, 12]
    assert meta.decode is not None and meta.decode.seq_lens_cpu == [10, 21]
    output = torch.full((tokens, h * v), float("nan"))
    impl.forward(
        None,  # type: ignore[arg-type]  # the layer: read for nothing here
        torch.cat(qs),
        torch.cat(kv_cs),
        torch.cat(k_pes).unsqueeze(1),
        cache,
        meta,
        output=output,
    )
    got = output.view(tokens, h, v).double()
    torch.testing.assert_close(got, torch.cat(want), atol=1e-5, rtol=1e-5)
    assert seam.served() == [
        {
            "device": "cpu",
            "path": "portable",
            "reason": seam.select_kernels("cpu").reason,
            "calls": 1,
        }
    ]


def test_warm_up_run_returns_zeros_and_refusals_name_the_cause() -> None:
    g = torch.Generator().manual_seed(0)
    impl, _, _ = _impl(2, 8, 4, 4, 4, g)
    out = torch.full((3, 8), 7.0)
    assert impl.forward(None, None, None, None, None, None, output=out) is out  # type: ignore[arg-type]
    assert out.abs().sum() == 0
    with pytest.raises(NotImplementedError, match="kv_cache_dtype='fp8'"):
        PluginMLAImpl(
            2, 12, 0.5, 1, None, None, "fp8", None, AttentionType.DECODER, None,
            q_lora_rank=None, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4,
            qk_head_dim=8, v_head_dim=4, kv_b_proj=impl.kv_b_proj,
        )  # fmt: skip
    with pytest.raises(NotImplementedError, match="sliding windows"):
        PluginMLAImpl(
            2, 12, 0.5, 1, None, 64, "auto", None, AttentionType.DECODER, None,
            q_lora_rank=None, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4,
            qk_head_dim=8, v_head_dim=4, kv_b_proj=impl.kv_b_proj,
        )  # fmt: skip
