"""Independent reference for the sampler tests: float64 numpy, full sort.

Kept set (vLLM's ``apply_top_k_top_p`` / flashinfer ``top_k_first``): tokens with
probability >= the k-th largest; then, over the renormalised top-k distribution, the
smallest prefix in descending order whose mass reaches ``top_p`` (ties at the boundary
kept). ``joint``: top-p mass relative to the whole distribution.

Goodness of fit: Pearson's chi-square over the kept tokens, cells with an expected count
below 5 pooled into one.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

# Per-test false-alarm rate of every goodness-of-fit assertion.
ALPHA = 1e-4


def probs64(logits: torch.Tensor) -> np.ndarray:
    x = logits.detach().double().cpu().numpy()
    finite = np.isfinite(x)
    e = np.where(finite, np.exp(x - x[finite].max()), 0.0)
    return e / e.sum()


def kept_mask(
    probs: np.ndarray, k: int | None, p: float | None, joint: bool = False
) -> np.ndarray:
    vocab = probs.shape[0]
    desc = np.sort(probs)[::-1]
    keep = np.ones(vocab, dtype=bool)
    floor = 0.0
    if k is not None and 0 < k < vocab:
        floor = desc[k - 1]
        keep &= probs >= floor
    if p is not None and p < 1:
        kept_desc = np.where(desc >= floor, desc, 0.0)
        mass = desc.sum() if joint else kept_desc.sum()
        j = int(np.searchsorted(np.cumsum(kept_desc), p * mass))
        keep &= probs >= desc[min(j, vocab - 1)]
    return keep


def reference(
    logits: torch.Tensor, k: int | None, p: float | None, joint: bool = False
) -> np.ndarray:
    """The distribution one row must be sampled from (float64, sums to 1)."""
    probs = probs64(logits)
    q = probs * kept_mask(probs, k, p, joint)
    return q / q.sum()


def chi_square_pvalue(samples: np.ndarray, expected: np.ndarray) -> float:
    """p-value of ``samples`` (token ids) against ``expected``; asserts that no token
    with expected probability 0 was drawn."""
    n = samples.shape[0]
    expected = expected / expected.sum()
    counts = np.bincount(samples, minlength=expected.shape[0])
    outside = np.flatnonzero((expected == 0) & (counts > 0))
    assert outside.size == 0, f"tokens outside the kept set were drawn: {outside[:10]}"
    exp = expected * n
    big = exp >= 5
    obs = np.append(counts[big], counts[~big].sum())
    e = np.append(exp[big], exp[~big].sum())
    if e[-1] == 0:
        obs, e = obs[:-1], e[:-1]
    if e.shape[0] < 2:
        return 1.0
    return float(stats.chisquare(obs, e).pvalue)


def binned_chi_square_pvalue(
    samples: np.ndarray, expected: np.ndarray, bins: int = 40
) -> float:
    """p-value of ``samples`` against ``expected`` over ``bins`` cells of about equal
    expected mass (tokens grouped by descending probability), for vocabularies too
    large for a per-token test; asserts that no token with probability 0 was drawn.

    The partition depends on ``expected`` only, so the statistic is a valid Pearson
    chi-square; it tests the mass of groups of similar tokens, not each token.
    """
    n = samples.shape[0]
    expected = expected / expected.sum()
    counts = np.bincount(samples, minlength=expected.shape[0])
    outside = np.flatnonzero((expected == 0) & (counts > 0))
    assert outside.size == 0, f"tokens outside the kept set were drawn: {outside[:10]}"
    order = np.argsort(-expected, kind="stable")
    before = np.cumsum(expected[order]) - expected[order]
    cell = np.minimum((before * bins).astype(np.int64), bins - 1)
    observed = np.bincount(cell, weights=counts[order], minlength=bins)
    mass = np.bincount(cell, weights=expected[order], minlength=bins)
    used = mass > 0
    if used.sum() < 2:
        return 1.0
    return float(stats.chisquare(observed[used], mass[used] * n).pvalue)
