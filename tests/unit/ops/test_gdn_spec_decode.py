"""The portable GDN kernels under speculative decoding (vLLM's multi-token layout).

References nobody here wrote: transformers 5.2.0's ``torch_recurrent_gated_delta_rule``
(run one sequence at a time from the state of the last kept token) and the layer's full
causal conv (``F.silu(conv1d(...))`` over the whole token history). The kernels see
vLLM's speculative layout: several query tokens per sequence, one state slot per query
token, ``num_accepted_tokens`` naming the slot (and conv window) the step starts from,
and conv slots ``K - 1 + num_spec`` wide. A step that keeps ``a`` of its tokens must
continue exactly as if only those ``a`` tokens had been fed.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5 import modeling_qwen3_5 as ref

from vllm_kunlun.ops.gdn import portable as P

TOL = 1e-5


def _full_conv(history: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """transformers' layer conv over a whole ``[dim, T]`` sequence, zero-padded left."""
    k = w.shape[-1]
    y = F.conv1d(history.unsqueeze(0), w.unsqueeze(1), padding=k - 1, groups=w.shape[0])
    return F.silu(y[..., : history.shape[-1]])[0]


@pytest.mark.parametrize(("num_spec", "k", "dim"), [(1, 4, 6), (2, 4, 8), (3, 3, 5)])
def test_conv_steps_continue_from_the_last_accepted_token(
    num_spec: int, k: int, dim: int
) -> None:
    gen = torch.Generator().manual_seed(num_spec)
    w = torch.randn(dim, k, generator=gen)
    prompts = [7, 2]  # two sequences, prompt lengths
    slots = [3, 1]
    pool = torch.randn(5, dim, k - 1 + num_spec, generator=gen)  # stale contents
    seqs = [torch.randn(dim, n, generator=gen) for n in prompts]
    # Prefill (vLLM's causal_conv1d_fn path), no initial state.
    x = torch.cat(seqs, dim=-1)
    qsl = torch.tensor([0, prompts[0], sum(prompts)])
    P.causal_conv1d_varlen(x, w, None, pool, qsl, torch.tensor(slots), None, "silu")
    accepted = torch.ones(2, dtype=torch.int32)  # after a prefill: one token kept
    for step, keep in enumerate([(num_spec + 1, 1), (1, num_spec + 1), (2, 1)]):
        lengths = [num_spec + 1, num_spec + 1] if step != 1 else [num_spec + 1, 1]
        new = [torch.randn(dim, n, generator=gen) for n in lengths]
        qsl = torch.tensor([0, lengths[0], sum(lengths)], dtype=torch.int32)
        out = P.causal_conv1d_multi(
            torch.cat(new, dim=-1).t().contiguous(),
            pool,
            w,
            None,
            "silu",
            torch.tensor([[s] * (num_spec + 1) for s in slots], dtype=torch.int32),
            qsl,
            accepted,
        )
        for n in range(2):
            expected = _full_conv(torch.cat([seqs[n], new[n]], dim=-1), w)
            got = out[qsl[n] : qsl[n + 1]].t()
            torch.testing.assert_close(
                got, expected[:, -lengths[n] :], atol=TOL, rtol=0
            )
            a = min(keep[n], lengths[n])
            seqs[n] = torch.cat([seqs[n], new[n][:, :a]], dim=-1)
            accepted[n] = a


def _spec_inputs(lengths: list[int], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    t, h, hv, dk, dv = sum(lengths), 2, 4, 16, 8
    return {
        "q": torch.randn(1, t, h, dk, generator=gen),
        "k": torch.randn(1, t, h, dk, generator=gen),
        "v": torch.randn(1, t, hv, dv, generator=gen),
        "g": F.logsigmoid(torch.rand(1, t, hv, generator=gen) * 4),
        "beta": torch.rand(1, t, hv, generator=gen).sigmoid(),
        "pool": torch.randn(16, hv, dk, dv, generator=gen),
    }


@pytest.mark.parametrize(
    ("lengths", "accepted"),
    [
        ([3, 3], [1, 3]),
        ([4, 2, 4], [2, 1, 4]),
        ([2], [2]),
        ([4, 4, 4, 4], [4, 1, 3, 2]),  # uniform: gathered once, one scatter each
    ],
)
def test_recurrent_starts_at_the_accepted_slot_and_writes_one_slot_per_token(
    lengths: list[int], accepted: list[int]
) -> None:
    x = _spec_inputs(lengths, seed=len(lengths))
    width = max(lengths)
    slots = torch.arange(len(lengths) * width, dtype=torch.int32).view(-1, width)
    pool = x["pool"].clone()
    before = x["pool"].clone()
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    out = P.recurrent_gated_delta_rule(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        16**-0.5,
        pool,
        cu,
        slots,
        True,
        torch.tensor(accepted, dtype=torch.int32),
    )
    repeat = x["v"].shape[2] // x["q"].shape[2]
    for n, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        h = before[slots[n, accepted[n] - 1]].unsqueeze(0)
        for t in range(e - s):
            q, k = (
                x[name][:, s + t : s + t + 1].repeat_interleave(repeat, dim=2)
                for name in ("q", "k")
            )
            o, h = ref.torch_recurrent_gated_delta_rule(
                q,
                k,
                x["v"][:, s + t : s + t + 1],
                g=x["g"][:, s + t : s + t + 1],
                beta=x["beta"][:, s + t : s + t + 1],
                initial_state=h,
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
            )
            torch.testing.assert_close(out[:, s + t], o[:, 0], atol=TOL, rtol=TOL)
            torch.testing.assert_close(pool[slots[n, t]], h[0], atol=TOL, rtol=TOL)


def test_recurrent_skips_a_pad_slot_and_writes_the_others() -> None:
    # Equal lengths, but one token's slot is the pad id: that state is not written
    # (the per-token path, not the one-scatter path), every other slot is, and the
    # outputs are those of the same call with that slot real.
    lengths, accepted = [3, 3], [2, 1]
    x = _spec_inputs(lengths, seed=7)
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    real = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    padded = real.clone()
    padded[1, 2] = P.PAD_SLOT_ID

    def call(slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pool = x["pool"].clone()
        out = P.recurrent_gated_delta_rule(
            *(x[name] for name in ("q", "k", "v", "g", "beta")),
            16**-0.5,
            pool,
            cu,
            slots,
            True,
            torch.tensor(accepted, dtype=torch.int32),
        )
        return out, pool

    want_out, want_pool = call(real)
    got_out, got_pool = call(padded)
    torch.testing.assert_close(got_out, want_out, atol=0, rtol=0)
    torch.testing.assert_close(got_pool[5], x["pool"][5], atol=0, rtol=0)
    keep = [i for i in range(16) if i != 5]
    torch.testing.assert_close(got_pool[keep], want_pool[keep], atol=0, rtol=0)
