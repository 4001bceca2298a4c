"""Contract of the portable sampling kernel (vllm_kunlun/ops/sampling_portable.py).

Statistical tests draw N = 20000 tokens per setting (the row repeated N times, one
uniform per row) and compare the frequencies with the renormalised filtered distribution
computed independently (tests/unit/sampler_reference.py, float64, full sort) by Pearson's
chi-square. A test fails when p < ALPHA = 1e-4: for a random seed a correct sampler trips
one of these tests with probability <= (number of tests) x 1e-4. Seeds are fixed, so the
outcome is deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.unit.sampler_reference import (
    ALPHA,
    chi_square_pvalue,
    kept_mask,
    probs64,
    reference,
)
from vllm_kunlun.ops import sampling_portable as sp

N = 20000


def _row(vocab: int, scale: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, generator=g) * scale


def _draw(
    row: torch.Tensor,
    k: int | None,
    p: float | None,
    *,
    probs_input: bool = False,
    inplace: bool = False,
    seed: int = 1,
) -> np.ndarray:
    batch = N
    scores = row.softmax(-1) if probs_input else row
    scores = scores.expand(batch, -1).contiguous()
    uniforms = torch.rand(batch, generator=torch.Generator().manual_seed(seed))
    kt = None if k is None else torch.full((batch,), k, dtype=torch.int32)
    pt = None if p is None else torch.full((batch,), p)
    tokens = sp.sample(
        scores, kt, pt, uniforms, scores_are_logits=not probs_input, inplace=inplace
    )
    assert tokens.dtype == torch.int64 and tokens.shape == (batch,)
    return tokens.numpy()


def _resolved(row: torch.Tensor, k: int | None, p: float | None) -> bool:
    """Whether the row is decided by its top-128 candidates (else: radix select)."""
    vocab = row.shape[0]
    kk = sp.normalize_top_k(k, 1, vocab, row.device)
    pp = sp.normalize_top_p(p, 1, row.device)
    plan = sp.plan_filter(row.unsqueeze(0).clone(), kk, pp, scores_are_logits=True)
    return bool(plan.resolved[0])


# (id, vocab, logit scale, top_k, top_p, candidate path expected)
SETTINGS = [
    ("unfiltered", 40, 1.5, None, None, False),
    ("unfiltered-3-blocks", 1300, 1.0, None, None, False),
    ("top_k-candidates", 300, 2.0, 25, None, True),
    ("top_p-candidates", 300, 3.0, None, 0.7, True),
    ("top_k-top_p-candidates", 300, 2.0, 60, 0.8, True),
    ("top_p-radix", 300, 0.3, None, 0.9, False),
    ("top_k-radix", 700, 0.5, 300, None, False),
    ("top_k-top_p-radix", 700, 0.5, 400, 0.95, False),
]


@pytest.mark.parametrize(
    "vocab,scale,k,p,candidates",
    [s[1:] for s in SETTINGS],
    ids=[s[0] for s in SETTINGS],
)
def test_frequencies_match_filtered_distribution(
    vocab: int, scale: float, k: int | None, p: float | None, candidates: bool
) -> None:
    row = _row(vocab, scale, seed=vocab + int(scale * 10))
    if k is not None or p is not None:
        assert _resolved(row, k, p) is candidates  # both code paths are exercised
    samples = _draw(row, k, p)
    assert chi_square_pvalue(samples, reference(row, k, p)) > ALPHA


@pytest.mark.parametrize("probs_input,inplace", [(True, False), (False, True)])
def test_frequencies_probs_input_and_inplace(probs_input: bool, inplace: bool) -> None:
    row = _row(600, 0.4, seed=11)
    samples = _draw(row, 350, 0.9, probs_input=probs_input, inplace=inplace)
    assert chi_square_pvalue(samples, reference(row, 350, 0.9)) > ALPHA


def test_temperature_changes_the_distribution_it_is_tested_against() -> None:
    """The same row at temperature 0.5 (logits / 0.5) fits its own reference only."""
    row = _row(200, 1.0, seed=5)
    hot = row / 0.5
    samples = _draw(hot, 50, 0.9)
    assert chi_square_pvalue(samples, reference(hot, 50, 0.9)) > ALPHA
    assert chi_square_pvalue(samples, reference(row, 50, 0.9)) < ALPHA  # power check


def test_kept_set_equals_reference_for_mixed_rows() -> None:
    """mask_logits keeps exactly the reference set, row by row, in mixed batches."""
    g = torch.Generator().manual_seed(3)
    for vocab, batch in ((7, 12), (300, 12), (1300, 12), (70000, 3)):
        logits = torch.randn(batch, vocab, generator=g) * (
            torch.rand(batch, 1, generator=g) * 4 + 0.1
        )
        k = torch.randint(-1, vocab + 3, (batch,), generator=g)
        p = torch.rand(batch, generator=g) * 1.2
        masked = sp.mask_logits(logits.clone(), k, p)
        for i in range(batch):
            ki = int(k[i])
            expected = kept_mask(
                probs64(logits[i]), ki if ki > 0 else None, float(p[i])
            )
            got = (masked[i] > float("-inf")).numpy()
            assert np.array_equal(got, expected), (vocab, i, ki, float(p[i]))
            kept = masked[i][got]
            assert torch.equal(kept, logits[i][got])  # kept logits unchanged


def test_draws_never_leave_the_kept_set_in_mixed_batches() -> None:
    g = torch.Generator().manual_seed(4)
    vocab, batch = 500, 64
    logits = torch.randn(batch, vocab, generator=g) * 0.7
    k = torch.randint(1, vocab + 1, (batch,), generator=g)
    p = torch.rand(batch, generator=g)
    keep = np.stack(
        [kept_mask(probs64(logits[i]), int(k[i]), float(p[i])) for i in range(batch)]
    )
    for _ in range(50):
        tokens = sp.sample(
            logits.clone(), k, p, torch.rand(batch, generator=g), scores_are_logits=True
        ).numpy()
        assert keep[np.arange(batch), tokens].all()


def test_peaked_distribution_returns_its_mode() -> None:
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(16, 1000, generator=g)
    mode = torch.randint(0, 1000, (16,), generator=g)
    logits[torch.arange(16), mode] = 40.0
    for k, p in [(None, None), (50, None), (None, 0.9), (500, 0.99)]:
        tokens = sp.sample(logits.clone(), k, p, torch.rand(16), scores_are_logits=True)
        assert torch.equal(tokens, mode)


def test_top_p_near_zero_acts_greedy() -> None:
    logits = torch.randn(32, 400, generator=torch.Generator().manual_seed(7)) * 0.05
    for _ in range(5):
        tokens = sp.sample(
            logits.clone(), None, 1e-7, torch.rand(32), scores_are_logits=True
        )
        assert torch.equal(tokens, logits.argmax(-1))


@pytest.mark.parametrize("k,p", [(300, None), (301, None), (0, None), (-1, 1.0)])
def test_disabled_filters_sample_the_unfiltered_distribution(
    k: int, p: float | None
) -> None:
    """top_k >= vocab or <= 0 and top_p >= 1 give exactly the unfiltered draw."""
    logits = torch.randn(40, 300, generator=torch.Generator().manual_seed(8))
    u = torch.rand(40)
    plain = sp.sample(logits.clone(), None, None, u, scores_are_logits=True)
    kt = torch.full((40,), k)
    got = sp.sample(logits.clone(), kt, p, u, scores_are_logits=True)
    assert torch.equal(got, plain)


def test_vocab_of_one_and_batches_of_zero_and_one() -> None:
    assert (
        sp.sample(torch.randn(5, 1), 3, 0.5, torch.rand(5), scores_are_logits=True)
        .eq(0)
        .all()
    )
    empty = sp.sample(
        torch.randn(0, 10), None, 0.5, torch.rand(0), scores_are_logits=True
    )
    assert empty.shape == (0,) and empty.dtype == torch.int64
    one = torch.tensor([[0.0, 50.0, 1.0]])
    assert sp.sample(one, 2, 0.9, torch.rand(1), scores_are_logits=True).tolist() == [1]


def test_minus_inf_logits_are_never_drawn() -> None:
    g = torch.Generator().manual_seed(9)
    logits = torch.randn(4000, 300, generator=g)
    banned = torch.rand(4000, 300, generator=g) < 0.5
    logits[banned] = float("-inf")
    for k, p in [(None, None), (200, None), (None, 0.95)]:
        tokens = sp.sample(
            logits.clone(), k, p, torch.rand(4000, generator=g), scores_are_logits=True
        )
        assert not banned[torch.arange(4000), tokens].any()


def test_rows_without_a_distribution_yield_token_0_and_leave_others_alone() -> None:
    """Documented: NaN logits or all -inf -> token 0 (no error: checking would sync)."""
    g = torch.Generator().manual_seed(10)
    logits = torch.randn(6, 300, generator=g)
    u = torch.rand(6, generator=g)
    bad = logits.clone()
    bad[1, 17] = float("nan")
    bad[3] = float("-inf")
    bad[4] = float("nan")
    for k, p in [(None, None), (20, None), (None, 0.9), (200, 0.99)]:
        clean = sp.sample(logits.clone(), k, p, u, scores_are_logits=True)
        got = sp.sample(bad.clone(), k, p, u, scores_are_logits=True)
        assert got[[1, 3, 4]].tolist() == [0, 0, 0]
        assert torch.equal(got[[0, 2, 5]], clean[[0, 2, 5]])


def test_check_nan_raises_on_request() -> None:
    probs = torch.full((2, 5), 0.2)
    probs[1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        sp.top_k_top_p_sampling_from_probs(probs, 3, 0.9, check_nan=True)


def test_a_rows_draw_does_not_depend_on_its_batch() -> None:
    """Same row, same uniform: same token alone or next to rows taking other paths."""
    g = torch.Generator().manual_seed(12)
    vocab = 700
    rows = torch.randn(8, vocab, generator=g) * 0.5
    k = torch.tensor([30, vocab, 400, vocab, 60, 300, vocab, 5])
    p = torch.tensor([1.0, 0.9, 0.95, 1.0, 0.5, 1.0, 0.2, 0.9])
    for trial in range(20):
        u = torch.rand(8, generator=g)
        together = sp.sample(rows.clone(), k, p, u, scores_are_logits=True)
        for i in range(8):
            alone = sp.sample(
                rows[i : i + 1].clone(),
                k[i : i + 1],
                p[i : i + 1],
                u[i : i + 1],
                scores_are_logits=True,
            )
            assert int(alone) == int(together[i]), (trial, i)


def test_device_mode_reads_nothing_on_the_host_and_matches_cpu_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On an accelerator every stage runs and no tensor value is read by the host.

    Simulated on the CPU: _maybe_any answers like on a device, and any host read of a
    tensor (item, bool, tolist, numpy) fails. The tokens equal the CPU-mode tokens.
    """
    g = torch.Generator().manual_seed(13)
    logits = torch.randn(10, 700, generator=g) * 0.6
    k = torch.tensor([30, 700, 400, 700, 60, 300, 700, 5, 700, 128])
    p = torch.tensor([1.0, 0.9, 0.95, 1.0, 0.5, 1.0, 0.2, 0.9, 1.0, 0.99])
    u = torch.rand(10, generator=g)
    cases = [(None, None), (k, None), (None, p), (k, p)]
    expected = [
        sp.sample(logits.clone(), kk, pp, u, scores_are_logits=True) for kk, pp in cases
    ]
    masks = [sp.mask_logits(logits.clone(), kk, pp) for kk, pp in cases]

    def host_read(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("host read of a tensor value (a device sync)")

    monkeypatch.setattr(sp, "_maybe_any", lambda mask: True)
    for name in ("item", "__bool__", "tolist", "numpy", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    got = [
        sp.sample(logits.clone(), kk, pp, u, scores_are_logits=True) for kk, pp in cases
    ]
    got_masks = [sp.mask_logits(logits.clone(), kk, pp) for kk, pp in cases]
    monkeypatch.undo()
    for e, t in zip(expected, got, strict=True):
        assert torch.equal(e, t)
    for e, t in zip(masks, got_masks, strict=True):
        assert torch.equal(e, t)


# ---- flashinfer-compatible entry points -------------------------------------------


def test_flashinfer_api_returns_int32_and_honours_the_generator() -> None:
    logits = torch.randn(64, 500, generator=torch.Generator().manual_seed(14))
    probs = logits.softmax(-1)
    k = torch.full((64,), 40, dtype=torch.int32)
    p = torch.full((64,), 0.9)
    a = sp.top_k_top_p_sampling_from_probs(
        probs, k, p, generator=torch.Generator().manual_seed(1)
    )
    b = sp.top_k_top_p_sampling_from_probs(
        probs, k, p, generator=torch.Generator().manual_seed(1)
    )
    c = sp.top_k_top_p_sampling_from_logits(
        logits, 40, 0.9, generator=torch.Generator().manual_seed(1)
    )
    assert a.dtype == torch.int32 and torch.equal(a, b)
    assert torch.equal(a, c)  # same uniforms, same kept set: same tokens
    assert torch.equal(probs, logits.softmax(-1))  # inputs untouched


def test_flashinfer_api_indices_and_joint_order() -> None:
    row = _row(300, 0.8, seed=15)
    probs = row.softmax(-1).unsqueeze(0)
    indices = torch.zeros(N, dtype=torch.int64)
    samples = sp.top_k_top_p_sampling_from_probs(
        probs,
        100,
        0.5,
        indices=indices,
        filter_apply_order="joint",
        generator=torch.Generator().manual_seed(2),
    )
    assert samples.shape == (N,)
    assert (
        chi_square_pvalue(samples.long().numpy(), reference(row, 100, 0.5, joint=True))
        > ALPHA
    )
    with pytest.raises(ValueError, match="filter_apply_order"):
        sp.top_k_top_p_sampling_from_probs(
            probs, 1, 0.5, filter_apply_order="top_p_first"
        )


def test_bad_shapes_are_explained() -> None:
    with pytest.raises(ValueError, match="2-D"):
        sp.sample(torch.randn(10), None, None, torch.rand(1), scores_are_logits=True)
    with pytest.raises(ValueError, match="top_k has shape"):
        sp.sample(
            torch.randn(2, 10),
            torch.ones(3),
            None,
            torch.rand(2),
            scores_are_logits=True,
        )
    with pytest.raises(ValueError, match="uniforms has shape"):
        sp.sample(torch.randn(2, 10), None, None, torch.rand(3), scores_are_logits=True)
