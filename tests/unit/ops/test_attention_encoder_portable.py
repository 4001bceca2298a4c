"""Encoder-only attention in plain torch (vllm_kunlun/ops/attention/encoder_portable.py)
against torch's own ``scaled_dot_product_attention``, one request at a time, with no
mask: every token sees every token of its request and none of another's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_kunlun.ops.attention import encoder_portable as E


def _reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: list[int], scale: float
) -> torch.Tensor:
    out, start = [], 0
    group = q.shape[1] // k.shape[1]
    for n in lens:
        qs = q[start : start + n].transpose(0, 1)  # [H, n, D]
        ks = k[start : start + n].repeat_interleave(group, dim=1).transpose(0, 1)
        vs = v[start : start + n].repeat_interleave(group, dim=1).transpose(0, 1)
        out.append(
            F.scaled_dot_product_attention(qs, ks, vs, scale=scale).transpose(0, 1)
        )
        start += n
    return torch.cat(out)


@pytest.mark.parametrize(
    ("lens", "heads", "kv_heads", "head_size"),
    [([5], 4, 4, 16), ([3, 17, 1, 8], 4, 2, 32), ([40, 2], 6, 1, 8)],
)
def test_matches_sdpa_per_request(
    lens: list[int], heads: int, kv_heads: int, head_size: int
) -> None:
    gen = torch.Generator().manual_seed(sum(lens))
    total = sum(lens)
    q = torch.randn(total, heads, head_size, generator=gen)
    k = torch.randn(total, kv_heads, head_size, generator=gen)
    v = torch.randn(total, kv_heads, head_size, generator=gen)
    starts = torch.tensor(
        [0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32
    )
    plan = E.plan_encoder(starts, max(lens), total)
    # vLLM's buffers are padded past the step's tokens; the tail must stay untouched.
    output = torch.full((total + 3, heads, head_size), 7.0)
    E.encoder_attention(q, k, v, plan, output, head_size**-0.5)
    want = _reference(q, k, v, lens, head_size**-0.5)
    torch.testing.assert_close(output[:total], want, atol=1e-5, rtol=1e-5)
    assert torch.all(output[total:] == 7.0)


def test_a_later_token_changes_an_earlier_ones_output() -> None:
    # Bidirectional: unlike causal attention, the first token sees the last.
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(4, 2, 8, generator=gen) for _ in range(3))
    plan = E.plan_encoder(torch.tensor([0, 4]), 4, 4)
    a = E.encoder_attention(q, k, v, plan, torch.empty(4, 2, 8), 0.35)
    k2, v2 = k.clone(), v.clone()
    k2[3] += 1.0
    v2[3] += 1.0
    b = E.encoder_attention(q, k2, v2, plan, torch.empty(4, 2, 8), 0.35)
    assert not torch.allclose(a[0], b[0])
