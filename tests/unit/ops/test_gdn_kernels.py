"""The portable GDN kernels against transformers 5.2.0's own torch references.

References nobody here wrote (``transformers/models/qwen3_5/modeling_qwen3_5.py``):
``torch_chunk_gated_delta_rule``, ``torch_recurrent_gated_delta_rule``,
``torch_causal_conv1d_update``, and the layer's full causal conv
(``F.silu(conv1d(x)[..., :seq_len])``) and gating lines. They run one batch of equal
lengths with the key heads already repeated per value head; ours run vLLM's varlen
layout (``[1, T, H, d]`` plus ``cu_seqlens``, GQA inside, states in a slot pool), so each
test lays the same numbers out both ways. The shapes follow flash-linear-attention's
chunk / fused-recurrent tests: lengths around the 64-token chunk, several heads ratios
and head sizes, zero and random initial states, decays from ``logsigmoid``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5 import modeling_qwen3_5 as ref

from vllm_kunlun.ops.gdn import portable as P

TOL = 1e-5


def _inputs(
    lengths: list[int], h: int, hv: int, dk: int, dv: int, seed: int = 0
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    t = sum(lengths)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    return {
        "q": randn(1, t, h, dk),
        "k": randn(1, t, h, dk),
        "v": randn(1, t, hv, dv),
        "g": F.logsigmoid(torch.rand(1, t, hv, generator=gen) * 4),
        "beta": torch.rand(1, t, hv, generator=gen).sigmoid(),
        "h0": randn(len(lengths), hv, dk, dv),
        "cu": torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()]),
    }


def _reference(x: dict[str, torch.Tensor], lengths: list[int], chunk: bool) -> tuple:
    """transformers' kernel, one sequence at a time (its batch dim needs equal lengths)."""
    fn = (
        ref.torch_chunk_gated_delta_rule
        if chunk
        else ref.torch_recurrent_gated_delta_rule
    )
    repeat = x["v"].shape[2] // x["q"].shape[2]
    outs, finals = [], []
    for n, (s, e) in enumerate(
        zip(x["cu"][:-1].tolist(), x["cu"][1:].tolist(), strict=True)
    ):
        q, k = (x[name][:, s:e].repeat_interleave(repeat, dim=2) for name in ("q", "k"))
        o, h = fn(
            q,
            k,
            x["v"][:, s:e],
            g=x["g"][:, s:e],
            beta=x["beta"][:, s:e],
            initial_state=x["h0"][n : n + 1].clone(),
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        outs.append(o)
        finals.append(h)
    return torch.cat(outs, dim=1), torch.cat(finals)


CASES = [
    # lengths, H, HV, dk, dv
    ([1], 2, 2, 16, 16),
    ([63, 64, 65], 2, 4, 16, 8),
    ([150], 1, 4, 32, 16),
    ([5, 130, 1, 64], 4, 8, 16, 32),
    ([200], 2, 2, 64, 64),
]


@pytest.mark.parametrize(("lengths", "h", "hv", "dk", "dv"), CASES)
def test_chunked_matches_transformers_chunked_and_recurrent(
    lengths: list[int], h: int, hv: int, dk: int, dv: int
) -> None:
    x = _inputs(lengths, h, hv, dk, dv)
    o, finals = P.chunk_gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], x["beta"], dk**-0.5, x["h0"].clone(), x["cu"]
    )
    for chunk in (True, False):
        o_ref, h_ref = _reference(x, lengths, chunk=chunk)
        torch.testing.assert_close(o, o_ref, atol=TOL, rtol=TOL)
        torch.testing.assert_close(finals, h_ref, atol=TOL, rtol=TOL)


# The recurrence is the decode kernel (a few tokens per sequence): shorter cases.
RECURRENT_CASES = [
    ([1], 2, 2, 16, 16),
    ([3, 17, 1], 2, 4, 16, 8),
    ([1, 1, 1, 1], 4, 8, 16, 32),
    ([24], 2, 2, 64, 64),
]


@pytest.mark.parametrize(("lengths", "h", "hv", "dk", "dv"), RECURRENT_CASES)
def test_recurrent_matches_transformers_in_a_state_pool(
    lengths: list[int], h: int, hv: int, dk: int, dv: int
) -> None:
    x = _inputs(lengths, h, hv, dk, dv, seed=1)
    # vLLM's layout: states live in a pool of slots, sequences name theirs.
    pool = torch.randn(len(lengths) + 3, hv, dk, dv)
    slots = torch.arange(len(lengths)).flip(0) + 2
    pool[slots] = x["h0"]
    untouched = pool[:2].clone()
    o = P.recurrent_gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], x["beta"], dk**-0.5, pool, x["cu"], slots
    )
    o_ref, h_ref = _reference(x, lengths, chunk=False)
    torch.testing.assert_close(o, o_ref, atol=TOL, rtol=TOL)
    torch.testing.assert_close(pool[slots], h_ref, atol=TOL, rtol=TOL)
    assert torch.equal(pool[:2], untouched)


def test_chunked_with_zero_initial_state_matches_transformers_without_one() -> None:
    x = _inputs([70], 2, 2, 16, 16, seed=2)
    o, h = P.chunk_gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], x["beta"], 16**-0.5, None, x["cu"]
    )
    o_ref, h_ref = ref.torch_chunk_gated_delta_rule(
        x["q"],
        x["k"],
        x["v"],
        g=x["g"],
        beta=x["beta"],
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    torch.testing.assert_close(o, o_ref, atol=TOL, rtol=TOL)
    torch.testing.assert_close(h, h_ref, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("splits", [[37, 63], [64, 64], [1, 1, 98], [20, 10, 70]])
def test_prefill_in_chunks_with_carried_state_equals_one_pass(
    splits: list[int],
) -> None:
    """Chunked prefill: pieces of one prompt, each starting from the state the previous
    piece left, give the one-pass output and final state (reference: transformers)."""
    total = sum(splits)
    x = _inputs([total], 2, 4, 16, 8, seed=3)
    o_ref, h_ref = _reference(x, [total], chunk=True)
    state, start, outs = x["h0"].clone(), 0, []
    for n in splits:
        piece = {k: x[k][:, start : start + n] for k in ("q", "k", "v", "g", "beta")}
        o, state = P.chunk_gated_delta_rule(
            piece["q"],
            piece["k"],
            piece["v"],
            piece["g"],
            piece["beta"],
            16**-0.5,
            state,
            torch.tensor([0, n]),
        )
        outs.append(o)
        start += n
    torch.testing.assert_close(torch.cat(outs, dim=1), o_ref, atol=TOL, rtol=TOL)
    torch.testing.assert_close(state, h_ref, atol=TOL, rtol=TOL)


def test_decode_steps_after_a_chunked_prefill_continue_the_sequence() -> None:
    x = _inputs([90], 2, 4, 16, 8, seed=4)
    o_ref, h_ref = _reference(x, [90], chunk=False)
    prefill = {k: x[k][:, :80] for k in ("q", "k", "v", "g", "beta")}
    o, state = P.chunk_gated_delta_rule(
        prefill["q"],
        prefill["k"],
        prefill["v"],
        prefill["g"],
        prefill["beta"],
        16**-0.5,
        x["h0"].clone(),
        torch.tensor([0, 80]),
    )
    pool = torch.zeros(4, 4, 16, 8)
    pool[3] = state[0]
    outs = [o]
    for t in range(80, 90):
        step = {k: x[k][:, t : t + 1] for k in ("q", "k", "v", "g", "beta")}
        outs.append(
            P.recurrent_gated_delta_rule(
                step["q"],
                step["k"],
                step["v"],
                step["g"],
                step["beta"],
                16**-0.5,
                pool,
                torch.tensor([0, 1]),
                torch.tensor([3]),
            )
        )
    torch.testing.assert_close(torch.cat(outs, dim=1), o_ref, atol=TOL, rtol=TOL)
    torch.testing.assert_close(pool[3:4], h_ref, atol=TOL, rtol=TOL)


# ---- causal conv1d ------------------------------------------------------------------------


def _conv_reference(
    x: torch.Tensor, weight: torch.Tensor, prefill: int
) -> torch.Tensor:
    """transformers' layer: full conv over the prompt, then torch_causal_conv1d_update
    per new token on its K-wide state. ``x`` is ``[dim, L]``."""
    dim, length = x.shape
    width = weight.shape[-1]
    first = x[None, :, :prefill]
    conv = F.conv1d(first, weight[:, None], padding=width - 1, groups=dim)
    out = [F.silu(conv[..., :prefill])]
    state = F.pad(first, (width - first.shape[-1], 0))  # what the layer caches
    for t in range(prefill, length):
        out.append(
            ref.torch_causal_conv1d_update(
                x[None, :, t : t + 1], state, weight, None, "silu"
            )
        )
    return torch.cat(out, dim=-1)[0]


@pytest.mark.parametrize(("num_seqs", "prefill"), [(3, 1), (2, 3), (1, 2), (2, 9)])
def test_conv_prefill_then_updates_equals_the_full_conv(
    num_seqs: int, prefill: int
) -> None:
    gen = torch.Generator().manual_seed(5)
    dim, width = 12, 4
    weight = torch.randn(dim, width, generator=gen)
    seqs = [torch.randn(dim, prefill + 6, generator=gen) for _ in range(num_seqs)]
    states = torch.randn(len(seqs) + 2, dim, width - 1, generator=gen)  # stale slots
    slots = torch.arange(len(seqs)) + 1
    # Prefill every sequence's first tokens in one varlen call, no initial state.
    heads = [s[:, :prefill] for s in seqs]
    starts = torch.tensor(
        [0, *torch.tensor([h.shape[1] for h in heads]).cumsum(0).tolist()]
    )
    out = P.causal_conv1d_varlen(
        torch.cat(heads, dim=1),
        weight,
        None,
        states,
        starts,
        slots,
        torch.zeros(len(seqs), dtype=torch.bool),
        "silu",
    )
    got = [[out[:, starts[i] : starts[i + 1]]] for i in range(len(seqs))]
    # Then one token per sequence per step, in a batch.
    for t in range(prefill, seqs[0].shape[1]):
        step = torch.stack([s[:, t] for s in seqs])
        y = P.causal_conv1d_step(step, states, weight, None, "silu", slots)
        for i in range(len(seqs)):
            got[i].append(y[i, :, None])
    for i, s in enumerate(seqs):
        torch.testing.assert_close(
            torch.cat(got[i], dim=-1),
            _conv_reference(s, weight, prefill),
            atol=TOL,
            rtol=TOL,
        )


def test_conv_varlen_continues_from_its_carried_state() -> None:
    gen = torch.Generator().manual_seed(6)
    dim, width = 8, 4
    weight, bias = (
        torch.randn(dim, width, generator=gen),
        torch.randn(dim, generator=gen),
    )
    x = torch.randn(dim, 50, generator=gen)
    full = F.silu(
        F.conv1d(x[None], weight[:, None], bias, padding=width - 1, groups=dim)[
            0, :, :50
        ]
    )
    states = torch.zeros(1, dim, width - 1)
    pieces, start = [], 0
    for n in (2, 17, 31):  # a 2-token piece is shorter than the K-1 history
        pieces.append(
            P.causal_conv1d_varlen(
                x[:, start : start + n],
                weight,
                bias,
                states,
                torch.tensor([0, n]),
                torch.tensor([0]),
                torch.tensor([start > 0]),
                "silu",
            )
        )
        start += n
    torch.testing.assert_close(torch.cat(pieces, dim=-1), full, atol=TOL, rtol=TOL)
    torch.testing.assert_close(states[0], x[:, -(width - 1) :], atol=0, rtol=0)


def test_conv_step_leaves_padding_rows_alone() -> None:
    states = torch.randn(3, 4, 3)
    before = states.clone()
    out = P.causal_conv1d_step(
        torch.randn(2, 4),
        states,
        torch.randn(4, 4),
        None,
        "silu",
        torch.tensor([-1, 2]),
    )
    assert torch.equal(out[0], torch.zeros(4))
    assert torch.equal(states[:2], before[:2]) and not torch.equal(states[2], before[2])


def test_gating_is_the_layers_formula() -> None:
    # modeling_qwen3_5.Qwen3_5GatedDeltaNet.forward:
    #   beta = b.sigmoid(); g = -self.A_log.float().exp() * F.softplus(a.float() + dt_bias)
    gen = torch.Generator().manual_seed(7)
    a, b = torch.randn(9, 4, generator=gen) * 10, torch.randn(9, 4, generator=gen)
    A_log, dt_bias = torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    g, beta = P.gdn_gating(A_log, a, b, dt_bias)
    torch.testing.assert_close(
        g[0], -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    )
    torch.testing.assert_close(beta[0], b.sigmoid())
    assert g.dtype == torch.float32 and g.shape == (1, 9, 4)


def _decode_gaps(pool_dtype: torch.dtype, steps: int = 768) -> torch.Tensor:
    """Decode ``steps`` bf16 tokens one at a time with the recurrent state kept in a
    ``pool_dtype`` slot between steps (what vLLM's state cache does), against
    transformers' recurrence over the whole sequence (its state stays float32): the
    per-token output gap."""
    gen = torch.Generator().manual_seed(7)
    h = hv = 2
    dk = dv = 32
    q = torch.randn(1, steps, h, dk, generator=gen).bfloat16()
    k = torch.randn(1, steps, h, dk, generator=gen).bfloat16()
    v = torch.randn(1, steps, hv, dv, generator=gen).bfloat16()
    # Long memory (decay near 1), as trained GDN heads have on most channels: the
    # state is a sum over many tokens, where rounding it each step adds up.
    g = torch.full((1, steps, hv), -0.002)
    beta = torch.full((1, steps, hv), 0.05)
    o_ref, _ = ref.torch_recurrent_gated_delta_rule(
        q.float(), k.float(), v.float(), g=g, beta=beta,
        initial_state=None, output_final_state=True, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    pool = torch.zeros(1, hv, dk, dv, dtype=pool_dtype)
    slot = torch.tensor([0])
    outs = []
    for t in range(steps):
        o = P.recurrent_gated_delta_rule(
            q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1],
            g[:, t : t + 1], beta[:, t : t + 1], dk**-0.5, pool, None, slot,
        )  # fmt: skip
        outs.append(o.float())
    return (torch.cat(outs, dim=1) - o_ref).abs().mean(dim=(0, 2, 3))


def test_a_float32_state_keeps_decode_exact_and_a_bf16_one_drifts() -> None:
    """Why the recurrent state follows the checkpoint's ``mamba_ssm_dtype`` (float32
    in every released Qwen3.5 / Qwen3-Next config; ops/gdn/state_dtype.py): in float32
    the only gap is the bf16 output's rounding, flat over the sequence; rounded to
    bf16 after every token the state drifts, the gap growing with position."""
    quarter = 768 // 4
    exact = _decode_gaps(torch.float32)
    first, last = exact[:quarter].mean(), exact[-quarter:].mean()
    assert last < 1.5 * first + 1e-4, (first, last)
    drift = _decode_gaps(torch.bfloat16)
    d_first, d_last = drift[:quarter].mean(), drift[-quarter:].mean()
    assert d_last > 2 * d_first, (d_first, d_last)
    assert d_last > 4 * last, (d_last, last)
