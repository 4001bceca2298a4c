"""Contract of the portable sampling kernel (vllm_kunlun/ops/sampling/portable.py).

Statistical tests draw N = 20000 tokens per setting (the row repeated N times) and
compare the frequencies with the renormalised filtered distribution computed
independently (tests/unit/sampler_reference.py, float64, full sort) by Pearson's
chi-square. A test fails when p < ALPHA = 1e-4: for a random seed a correct sampler trips
one of these tests with probability <= (number of tests) x 1e-4. Seeds are fixed, so the
outcome is deterministic. Each setting names the path that decides its kept set: the
top-128 candidates, the radix threshold, or (CPU, top-p without top-k, several uniforms
per row) the draw-time test with rejection rounds; the test asserts the path is taken.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.unit.sampler_reference import (
    ALPHA,
    binned_chi_square_pvalue,
    chi_square_pvalue,
    kept_mask,
    probs64,
    reference,
)
from vllm_kunlun.ops.sampling import flashinfer_api, kept_set, threshold
from vllm_kunlun.ops.sampling import portable as sp

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
    draws: int = sp.DRAWS,
) -> np.ndarray:
    batch = N
    scores = row.softmax(-1) if probs_input else row
    scores = scores.expand(batch, -1).contiguous()
    g = torch.Generator().manual_seed(seed)
    uniforms = torch.rand(batch, draws, generator=g)
    kt = None if k is None else torch.full((batch,), k, dtype=torch.int32)
    pt = None if p is None else torch.full((batch,), p)
    tokens = sp.sample(
        scores, kt, pt, uniforms, scores_are_logits=not probs_input, inplace=inplace
    )
    assert tokens.dtype == torch.int64 and tokens.shape == (batch,)
    return tokens.numpy()


def _path(row: torch.Tensor, k: int | None, p: float | None, draws: int) -> str:
    """Which path decides the row's kept set: candidates, rejection, radix, none."""
    vocab = row.shape[0]
    kk = threshold.normalize_top_k(k, 1, vocab, row.device)
    pp = threshold.normalize_top_p(p, 1, row.device)
    plan = kept_set.plan_filter(
        row.unsqueeze(0).clone(),
        kk,
        pp,
        scores_are_logits=True,
        defer_top_p=draws >= 2,
    )
    if bool(plan.resolved[0]):
        return "candidates"
    if plan.deferred is not None and bool(plan.deferred[0]):
        return "rejection"
    return "radix" if plan.threshold is not None else "none"


# (id, vocab, logit scale, top_k, top_p, uniforms per row, expected path)
SETTINGS = [
    ("unfiltered", 40, 1.5, None, None, 4, "none"),
    ("unfiltered-3-blocks", 1300, 1.0, None, None, 4, "none"),
    ("top_k-candidates", 300, 2.0, 25, None, 4, "candidates"),
    ("top_k-top_p-candidates", 300, 2.0, 60, 0.8, 4, "candidates"),
    ("top_p-rejection", 300, 0.3, None, 0.9, 4, "rejection"),
    ("top_p-rejection-peaked", 300, 3.0, None, 0.7, 4, "rejection"),
    # Small top-p on a flat row: most first draws are rejected, so the rounds and the
    # exact fallback after them decide many rows.
    ("top_p-rejection-rounds", 600, 0.2, None, 0.15, 4, "rejection"),
    ("top_p-rejection-one-round", 600, 0.2, None, 0.3, 2, "rejection"),
    ("top_p-radix", 300, 0.3, None, 0.9, 1, "radix"),
    ("top_k-radix", 700, 0.5, 300, None, 4, "radix"),
    ("top_k-top_p-radix", 700, 0.5, 400, 0.95, 4, "radix"),
]


@pytest.mark.parametrize(
    "vocab,scale,k,p,draws,path",
    [s[1:] for s in SETTINGS],
    ids=[s[0] for s in SETTINGS],
)
def test_frequencies_match_filtered_distribution(
    vocab: int,
    scale: float,
    k: int | None,
    p: float | None,
    draws: int,
    path: str,
) -> None:
    row = _row(vocab, scale, seed=vocab + int(scale * 10))
    assert _path(row, k, p, draws) == path  # every code path is exercised
    samples = _draw(row, k, p, draws=draws)
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
    for trial in range(50):
        draws = sp.DRAWS if trial % 2 else 1
        tokens = sp.sample(
            logits.clone(),
            k,
            p,
            torch.rand(batch, draws, generator=g),
            scores_are_logits=True,
        ).numpy()
        assert keep[np.arange(batch), tokens].all()
        top_p_only = sp.sample(
            logits.clone(),
            None,
            p,
            torch.rand(batch, sp.DRAWS, generator=g),
            scores_are_logits=True,
        ).numpy()
        keep_p = [
            kept_mask(probs64(logits[i]), None, float(p[i])) for i in range(batch)
        ]
        assert np.stack(keep_p)[np.arange(batch), top_p_only].all()


def test_peaked_distribution_returns_its_mode() -> None:
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(16, 1000, generator=g)
    mode = torch.randint(0, 1000, (16,), generator=g)
    logits[torch.arange(16), mode] = 40.0
    for k, p in [(None, None), (50, None), (None, 0.9), (500, 0.99)]:
        for draws in (1, sp.DRAWS):
            tokens = sp.sample(
                logits.clone(), k, p, torch.rand(16, draws), scores_are_logits=True
            )
            assert torch.equal(tokens, mode)


def test_top_p_near_zero_acts_greedy() -> None:
    logits = torch.randn(32, 400, generator=torch.Generator().manual_seed(7)) * 0.05
    for draws in (1, 2, sp.DRAWS):
        for top_p in (1e-7, 0.0):
            tokens = sp.sample(
                logits.clone(),
                None,
                top_p,
                torch.rand(32, draws),
                scores_are_logits=True,
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
        for draws in (1, sp.DRAWS):
            tokens = sp.sample(
                logits.clone(),
                k,
                p,
                torch.rand(4000, draws, generator=g),
                scores_are_logits=True,
            )
            assert not banned[torch.arange(4000), tokens].any()


def test_rows_without_a_distribution_yield_token_0_and_leave_others_alone() -> None:
    """Documented: NaN logits or all -inf -> token 0 (no error: checking would sync)."""
    g = torch.Generator().manual_seed(10)
    logits = torch.randn(6, 300, generator=g)
    u = torch.rand(6, sp.DRAWS, generator=g)
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
        flashinfer_api.top_k_top_p_sampling_from_probs(probs, 3, 0.9, check_nan=True)


def test_a_rows_draw_does_not_depend_on_its_batch() -> None:
    """Same row, same uniform: same token alone or next to rows taking other paths."""
    g = torch.Generator().manual_seed(12)
    vocab = 700
    rows = torch.randn(8, vocab, generator=g) * 0.5
    k = torch.tensor([30, vocab, 400, vocab, 60, 300, vocab, 5])
    p = torch.tensor([1.0, 0.9, 0.95, 1.0, 0.5, 1.0, 0.2, 0.9])
    for trial in range(20):
        u = torch.rand(8, 1 + 3 * (trial % 2), generator=g)
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

    Simulated on the CPU: ``on_host`` answers like on a device, and any host read of a
    tensor (item, bool, tolist, numpy) fails. The tokens equal the CPU-mode tokens of
    the exact-threshold path (one uniform per row); with several uniforms per row the
    device path still takes the exact threshold and uses the first column.
    """
    g = torch.Generator().manual_seed(13)
    logits = torch.randn(10, 700, generator=g) * 0.6
    k = torch.tensor([30, 700, 400, 700, 60, 300, 700, 5, 700, 128])
    p = torch.tensor([1.0, 0.9, 0.95, 1.0, 0.5, 1.0, 0.2, 0.9, 1.0, 0.99])
    u = torch.rand(10, sp.DRAWS, generator=g)
    cases = [(None, None), (k, None), (None, p), (k, p)]
    expected = [
        sp.sample(logits.clone(), kk, pp, u[:, :1], scores_are_logits=True)
        for kk, pp in cases
    ]
    masks = [sp.mask_logits(logits.clone(), kk, pp) for kk, pp in cases]

    def host_read(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("host read of a tensor value (a device sync)")

    monkeypatch.setattr(threshold, "on_host", lambda t: False)
    for name in ("item", "__bool__", "tolist", "numpy", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    got = [
        sp.sample(logits.clone(), kk, pp, u, scores_are_logits=True, inplace=True)
        for kk, pp in cases
    ]
    got_masks = [sp.mask_logits(logits.clone(), kk, pp) for kk, pp in cases]
    monkeypatch.undo()
    for e, t in zip(expected, got, strict=True):
        assert torch.equal(e, t)
    for e, t in zip(masks, got_masks, strict=True):
        assert torch.equal(e, t)


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
    with pytest.raises(TypeError, match=r"must be a torch\.Tensor"):
        sp.sample([[0.0, 1.0]], None, None, torch.rand(1), scores_are_logits=True)  # type: ignore[arg-type]


def test_a_single_value_applies_to_every_row_as_in_vllm() -> None:
    """k / p tensors of shape (1,) broadcast (vLLM does), in sample and mask_logits."""
    g = torch.Generator().manual_seed(16)
    logits = torch.randn(6, 500, generator=g)
    u = torch.rand(6, sp.DRAWS, generator=g)
    k1, p1 = torch.tensor([30]), torch.tensor([0.8])
    kb, pb = torch.full((6,), 30), torch.full((6,), 0.8)
    assert torch.equal(
        sp.sample(logits.clone(), k1, p1, u, scores_are_logits=True),
        sp.sample(logits.clone(), kb, pb, u, scores_are_logits=True),
    )
    for k, p, kk, pp in ((k1, None, kb, None), (None, p1, None, pb), (k1, p1, kb, pb)):
        assert torch.equal(
            sp.mask_logits(logits.clone(), k, p), sp.mask_logits(logits.clone(), kk, pp)
        )


# ---- vocabulary 128K: the main paths at full scale --------------------------------

BIG = 128256


def _big_row(seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(BIG, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize(
    "k,p,scale",
    [(None, 0.9, 1.0), (None, 0.5, 2.0), (None, 0.95, 5.0), (50, None, 1.0)],
    ids=["top_p-0.9", "top_p-0.5", "top_p-peaked", "top_k-50"],
)
def test_vocab_128k_draws_fit_the_filtered_distribution(
    k: int | None, p: float | None, scale: float
) -> None:
    """The batched CPU path at full vocabulary: 8 x 128 rows, one logits row repeated.

    Binned chi-square (20 cells of equal expected mass) and never a masked token.
    """
    row = _big_row(17, scale)
    expected = reference(row, k, p)
    g = torch.Generator().manual_seed(18)
    samples = []
    for _ in range(8):
        batch = row.expand(128, -1).contiguous()
        tokens = sp.sample(
            batch,
            k,
            p,
            torch.rand(128, sp.DRAWS, generator=g),
            scores_are_logits=True,
            inplace=True,
        )
        samples.append(tokens.numpy())
    assert binned_chi_square_pvalue(np.concatenate(samples), expected, 20) > ALPHA


def test_vocab_128k_kept_sets_equal_the_reference() -> None:
    """mask_logits at 128K, candidate and radix rows mixed, row by row exact."""
    g = torch.Generator().manual_seed(19)
    logits = torch.randn(4, BIG, generator=g) * torch.tensor(
        [[0.5], [1.0], [3.0], [8.0]]
    )
    k = torch.tensor([BIG, 40, 5000, BIG])
    p = torch.tensor([0.9, 0.95, 0.8, 0.5])
    masked = sp.mask_logits(logits.clone(), k, p)
    for i in range(4):
        ki = int(k[i])
        expected = kept_mask(probs64(logits[i]), ki if ki < BIG else None, float(p[i]))
        assert np.array_equal((masked[i] > float("-inf")).numpy(), expected), i
