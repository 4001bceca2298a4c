"""Portable torch implementation of top-k / top-p sampling (flashinfer's semantics).

Why: the vendor sampling kernel exists only on Kunlun, and requests with their own seed
cannot use it at all (it takes one generator per batch). This module is the sampler used
everywhere else: on the CPU, on other CUDA devices, for seeded rows, and as the reference
the vendor kernel is tested against.

How, without sorting the vocabulary and without a host/device synchronisation:

* One uniform ``u`` per row and inverse-transform sampling: the token is the first
  index whose cumulative weight exceeds ``u * total``. The cumulative sum is two-level
  (sums of 512-token blocks, then one block), so the whole vocabulary is read once.
* The filter is a per-row threshold ``T``: a token is kept when its weight is ``>= T``
  (ties at the boundary are kept, as in vLLM's ``apply_top_k_top_p``).
  - First ``topk(C)`` with a small static ``C`` (128): when the top-k set and the top-p
    nucleus lie inside those candidates (the common case: top_k <= 128, peaked
    distributions), the row is sampled among its candidates and nothing else is read.
  - Otherwise the exact threshold comes from a radix select over the float bits
    of the weights (per-row histograms of count and mass over 2 to 4 levels of bits,
    by vocabulary size), a fixed number of full passes, no data-dependent control flow.
* On the CPU, where reading a tensor costs no synchronisation, work that no row needs is
  skipped; on an accelerator every stage runs unconditionally (sync-free).

Semantics (as flashinfer with ``filter_apply_order="top_k_first"`` and vLLM's native
sampler): top-k first, then top-p over the renormalised top-k distribution. ``top_k``
<= 0 or >= vocab means no top-k; ``top_p`` >= 1 means no top-p; ``top_p`` <= 0 keeps
only the most likely token(s). Weights are compared in float32 probability space, so
two logits that round to the same probability count as a tie.
A row whose logits contain NaN, or whose logits are all -inf, has no distribution; like
vLLM's native sampler it yields token 0 (checking would synchronise every step; pass
``check_nan=True`` to the flashinfer-style entry points to raise instead).
Resolution: ``u`` is float32, so a token whose probability is below ~6e-8 per row may be
sampled slightly more or less often than its probability (fp32 rounding of the weights
is of the same order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Candidates tried before the exact radix select. Static, so shapes never depend on data.
CANDIDATES = 128
# Block size of the two-level cumulative sum.
BLOCK = 512


def radix_levels(vocab: int) -> tuple[tuple[int, int], ...]:
    """(shift, width) per radix level over the 31 value bits of a non-negative float32.

    Each level costs a few passes over the data and a (batch, 2**width) histogram:
    wide levels for large vocabularies (fewer passes), narrow ones for small
    vocabularies (so the histograms never dwarf the data).
    """
    if vocab >= 1 << 16:
        return ((16, 15), (0, 16))
    if vocab >= 1 << 10:
        return ((20, 11), (10, 10), (0, 10))
    return ((24, 7), (16, 8), (8, 8), (0, 8))


_FILTER_ORDERS = ("top_k_first", "joint")


def _maybe_any(mask: torch.Tensor) -> bool:
    """``mask.any()`` on the CPU; True on an accelerator, where reading it would sync."""
    if mask.device.type == "cpu":
        return bool(mask.any())
    return True


def normalize_top_k(
    top_k: torch.Tensor | int | None, batch: int, vocab: int, device: torch.device
) -> torch.Tensor | None:
    """int64 (batch,) with ``vocab`` for "no top-k", or None when no row filters."""
    if top_k is None:
        return None
    if isinstance(top_k, torch.Tensor):
        if top_k.shape not in ((batch,), (batch, 1)):
            raise ValueError(
                f"top_k has shape {tuple(top_k.shape)}; expected ({batch},), one value "
                "per row"
            )
        k = top_k.reshape(batch).to(device=device, dtype=torch.int64)
    else:
        k = torch.full((batch,), int(top_k), dtype=torch.int64, device=device)
    return torch.where((k <= 0) | (k > vocab), vocab, k)


def normalize_top_p(
    top_p: torch.Tensor | float | None, batch: int, device: torch.device
) -> torch.Tensor | None:
    """float32 (batch,), values >= 1 meaning "no top-p", or None."""
    if top_p is None:
        return None
    if isinstance(top_p, torch.Tensor):
        if top_p.shape not in ((batch,), (batch, 1)):
            raise ValueError(
                f"top_p has shape {tuple(top_p.shape)}; expected ({batch},), one value "
                "per row"
            )
        return top_p.reshape(batch).to(device=device, dtype=torch.float32)
    return torch.full((batch,), float(top_p), dtype=torch.float32, device=device)


def _first_above(cum: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose cumulative weight exceeds ``target``.

    Never lands on a zero-weight entry: ``target`` >= 0 skips leading zeros, and the
    result is capped at the last entry that adds weight (rounding can put ``target`` at
    or past the total). Rows without weight (all zero or NaN) get some valid index;
    callers map them to token 0.
    """
    idx = torch.searchsorted(cum, target.unsqueeze(1), right=True)
    last = torch.searchsorted(cum, cum[:, -1:].contiguous())
    return torch.minimum(idx, last).squeeze(1).clamp_(0, cum.shape[1] - 1)


def _radix_select(
    weights: torch.Tensor,
    *,
    count: torch.Tensor | None = None,
    fraction: torch.Tensor | None = None,
    base: torch.Tensor | None = None,
    scratch: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Largest threshold T per row whose kept set ``weights >= T`` is big enough.

    Big enough: at least ``count`` tokens, or else at least ``fraction * base`` mass,
    where a NaN ``base`` (or None) means the row's total mass. A target that cannot be
    met (+inf) gives T = 0, i.e. keep everything. ``weights``: contiguous non-negative
    float32 (B, V). ``scratch``: reusable (int32, int64) key buffers shaped like
    ``weights``. Returns (T as float32, mass of weights >= T).
    """
    by_count = count is not None
    batch = weights.shape[0]
    device = weights.device
    bits = weights.view(torch.int32)
    # Keys are computed in int32 (half the memory traffic), then copied into the int64
    # index that scatter_add_ requires; both buffers are reused across levels. Keys
    # count down from the largest value, so a plain cumsum of a histogram is the mass
    # (or count) of all tokens at or above each bin.
    key32, key = scratch if scratch is not None else radix_scratch(weights)
    prefix = torch.zeros(batch, dtype=torch.int64, device=device)
    ones = torch.ones(1, dtype=torch.float32, device=device).expand(weights.shape)
    target = count.to(torch.float32) if count is not None else None
    # Flat scratch, viewed per level as a contiguous (batch, bins) histogram.
    levels = radix_levels(weights.shape[1])
    widest = batch * (max(1 << width for _, width in levels) + 2)
    mass_buf = torch.empty(widest, dtype=torch.float32, device=device)
    count_buf = torch.empty_like(mass_buf) if by_count else None
    last = len(levels) - 1
    cum_mass = mass_buf[:batch].view(batch, 1)
    first = prefix
    offset = 0
    for level, (shift, width) in enumerate(levels):
        nbins = 1 << width
        torch.bitwise_right_shift(bits, shift, out=key32)
        if level == 0:
            # Value bin b -> key nbins-1-b. -0.0 / negative NaN (sign bit) -> bin 0.
            top = torch.full((batch, 1), nbins - 1, dtype=torch.int32, device=device)
            torch.sub(top, key32, out=key32).clamp_(0, nbins - 1)
            offset, total_bins = 0, nbins
        else:
            # Inside the chosen bin -> 1..nbins (descending); above -> 0; below ->
            # nbins + 1.
            end = ((prefix << width) + nbins).to(torch.int32).unsqueeze(1)
            torch.sub(end, key32, out=key32).clamp_(0, nbins + 1)
            offset, total_bins = 1, nbins + 2
        key.copy_(key32)
        if not by_count or level == last:
            cum_mass = mass_buf[: batch * total_bins].view(batch, total_bins)
            cum_mass.zero_()
            cum_mass.scatter_add_(1, key, weights).cumsum_(1)
        if count_buf is not None:
            cum_count = count_buf[: batch * total_bins].view(batch, total_bins)
            cum_count.zero_().scatter_add_(1, key, ones).cumsum_(1)
            criterion = cum_count
        else:
            if level == 0:
                assert fraction is not None
                total = cum_mass[:, -1]
                if base is not None:
                    total = torch.where(torch.isnan(base), total, base)
                target = fraction * total
            criterion = cum_mass
        assert target is not None
        # First (largest-value) bin whose cumulative count/mass reaches the target;
        # none reaches it -> the lowest bin, i.e. keep everything.
        first = torch.searchsorted(criterion, target.unsqueeze(1)).squeeze(1)
        first = first.sub_(offset).clamp_(0, nbins - 1)
        prefix = (prefix << width) | (nbins - 1 - first)
    mass_ge = cum_mass.gather(1, (first + offset).unsqueeze(1)).squeeze(1)
    threshold = prefix.to(torch.int32).view(torch.float32)
    return threshold, mass_ge


def radix_scratch(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int32, int64) key buffers for ``_radix_select`` on ``weights``."""
    return (
        torch.empty(weights.shape, dtype=torch.int32, device=weights.device),
        torch.empty(weights.shape, dtype=torch.int64, device=weights.device),
    )


def radix_threshold(
    weights: torch.Tensor,
    k: torch.Tensor | None,
    p: torch.Tensor | None,
    joint: bool = False,
    scratch: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Exact per-row keep-threshold on ``weights`` for top-k then top-p (float32, B).

    ``k``/``p`` as from normalize_top_k/_p (``k == vocab``: no top-k). Top-p mass is
    relative to the top-k mass (``joint``: to the row's total mass).
    """
    scratch = scratch if scratch is not None else radix_scratch(weights)
    batch, vocab = weights.shape
    threshold = torch.zeros(batch, dtype=torch.float32, device=weights.device)
    base: torch.Tensor | None = None
    if k is not None:
        threshold, mass_k = _radix_select(weights, count=k, scratch=scratch)
        if not joint:
            base = torch.where(k < vocab, mass_k, torch.full_like(mass_k, float("nan")))
    if p is not None:
        fraction = torch.where(p < 1, p, torch.full_like(p, float("inf")))
        t_p, _ = _radix_select(weights, fraction=fraction, base=base, scratch=scratch)
        threshold = torch.maximum(threshold, t_p)
    return threshold


def block_sums(weights: torch.Tensor) -> torch.Tensor:
    """Per-row sums of consecutive ``BLOCK``-token blocks (last block may be short)."""
    vocab = weights.shape[1]
    block = min(BLOCK, vocab)
    nblocks = vocab // block
    main = nblocks * block
    sums = weights[:, :main].unflatten(1, (nblocks, block)).sum(-1)
    if main < vocab:
        sums = torch.cat([sums, weights[:, main:].sum(-1, keepdim=True)], dim=1)
    return sums


def sample_full(
    weights: torch.Tensor,
    uniforms: torch.Tensor,
    threshold: torch.Tensor | None = None,
    sums: torch.Tensor | None = None,
    owned: bool = False,
    scratch: torch.Tensor | None = None,
) -> torch.Tensor:
    """Inverse-transform sample over the whole vocabulary (int64, B).

    ``weights`` need not be normalised. With ``threshold``, weights below it count as 0
    (zeroed in place when ``owned``).
    ``sums`` are precomputed ``block_sums(weights)`` (only valid without a threshold).
    ``scratch``: a reusable float32 buffer shaped like ``weights`` for the mask.
    """
    vocab = weights.shape[1]
    block = min(BLOCK, vocab)
    if threshold is not None:
        # A float 0/1 mask written by the comparison itself: bool masks go through a
        # slow, unvectorised cast on the CPU (masked_fill_ costs ~7x more).
        keep = torch.empty_like(weights) if scratch is None else scratch
        torch.ge(weights, threshold.unsqueeze(1), out=keep)
        masked = weights.mul_(keep) if owned else keep.mul_(weights)
        sums = block_sums(masked)
    else:
        masked = weights
        if sums is None:
            sums = block_sums(weights)
    cum = sums.cumsum(-1)
    target = uniforms * cum[:, -1]
    chosen = _first_above(cum, target)
    before = cum.gather(1, chosen.unsqueeze(1)) - sums.gather(1, chosen.unsqueeze(1))
    rest = (target.unsqueeze(1) - before).clamp_(min=0).squeeze(1)
    cols = chosen.unsqueeze(1) * block + torch.arange(block, device=weights.device)
    valid = cols < vocab
    vals = masked.gather(1, cols.clamp(max=vocab - 1)) * valid
    offset = _first_above(vals.cumsum(-1), rest)
    tokens = chosen * block + offset
    # No distribution (NaN / all -inf / all zero): token 0, documented.
    return torch.where(cum[:, -1] > 0, tokens, torch.zeros_like(tokens))


@dataclass
class FilterPlan:
    """The top-k / top-p decision for one batch, before any random draw.

    ``resolved`` rows are fully decided by their ``CANDIDATES`` candidates
    (``cand_idx`` with weights ``cand_weights``, zero when filtered out) and keep exactly
    the tokens scoring ``>= cand_threshold`` (in the caller's score space). All other
    rows use ``weights`` over the whole vocabulary with keep-threshold ``threshold``
    (None: keep all). ``sums`` are the unmasked block sums when already computed.
    ``owns_weights``: ``weights`` is scratch the sampler may overwrite.
    """

    resolved: torch.Tensor
    cand_idx: torch.Tensor | None
    cand_weights: torch.Tensor | None
    cand_threshold: torch.Tensor | None
    weights: torch.Tensor | None
    threshold: torch.Tensor | None
    sums: torch.Tensor | None
    any_full: bool
    owns_weights: bool = False
    scratch: torch.Tensor | None = None


def plan_filter(
    scores: torch.Tensor,
    k: torch.Tensor | None,
    p: torch.Tensor | None,
    *,
    scores_are_logits: bool,
    inplace: bool = False,
    joint: bool = False,
) -> FilterPlan:
    """Decide the kept set of every row. ``k``/``p`` come from normalize_top_k/_p.

    With ``inplace`` (logits only) the weights overwrite ``scores``.
    """
    batch, vocab = scores.shape
    device = scores.device
    weights: torch.Tensor | None = None
    sums: torch.Tensor | None = None

    def full_weights() -> torch.Tensor:
        # Logits -> exp(logit - row max): unnormalised, on the same scale as the
        # candidates' weights below, so a row's numbers never depend on its batch.
        nonlocal weights
        if weights is None:
            if not scores_are_logits:
                weights = scores
            elif inplace:
                weights = scores.sub_(scores.amax(-1, keepdim=True)).exp_()
            else:
                weights = (scores - scores.amax(-1, keepdim=True)).exp_()
        return weights

    if k is None and p is None:
        return FilterPlan(
            resolved=torch.zeros(batch, dtype=torch.bool, device=device),
            cand_idx=None,
            cand_weights=None,
            cand_threshold=None,
            weights=full_weights(),
            threshold=None,
            sums=None,
            any_full=True,
            owns_weights=scores_are_logits,
        )

    ncand = min(vocab, CANDIDATES)
    every = ncand == vocab
    cand, cand_idx = scores.topk(ncand, dim=-1)
    lowest = cand[:, -1]
    cand_w = (cand - cand[:, :1]).exp() if scores_are_logits else cand
    no_row = torch.zeros(batch, dtype=torch.bool, device=device)
    k_on = no_row if k is None else k < vocab
    p_on = no_row if p is None else p < 1
    filtered = k_on | p_on

    # Top-p rows without top-k (all top-p rows with joint) need the row's total mass;
    # unfiltered rows need the full weights anyway.
    total: torch.Tensor | None = None
    need_total = p is not None and _maybe_any(p_on & (~k_on | joint))
    if need_total or _maybe_any(~filtered):
        sums = block_sums(full_weights())
        total = sums.cumsum(-1)[:, -1]

    kept = torch.ones_like(cand, dtype=torch.bool)
    resolved = torch.ones(batch, dtype=torch.bool, device=device)
    cand_threshold = torch.full((batch,), float("-inf"), device=device)
    if k is not None:
        t_k = cand.gather(1, (k.clamp(max=ncand) - 1).unsqueeze(1)).squeeze(1)
        kept = (cand >= t_k.unsqueeze(1)) | ~k_on.unsqueeze(1)
        k_ok = (k <= ncand) & ((lowest < t_k) | every)
        resolved = ~k_on | k_ok
        cand_threshold = torch.where(k_on, t_k, cand_threshold)
    if p is not None:
        csum = (cand_w * kept).cumsum(-1)
        if total is None:  # no row reaches this branch needing the total
            mass = csum[:, -1]
        elif joint:
            mass = total
        else:
            mass = torch.where(k_on, csum[:, -1], total)
        j = (csum < (p * mass).unsqueeze(1)).sum(-1)
        t_p = cand.gather(1, j.clamp(max=ncand - 1).unsqueeze(1)).squeeze(1)
        kept = kept & ((cand >= t_p.unsqueeze(1)) | ~p_on.unsqueeze(1))
        p_ok = (j < ncand) & ((lowest < t_p) | every)
        resolved = resolved & (~p_on | p_ok)
        cand_threshold = torch.where(
            p_on, torch.maximum(cand_threshold, t_p), cand_threshold
        )
    resolved = resolved & filtered
    cand_weights = cand_w * kept

    unresolved = filtered & ~resolved
    any_full = _maybe_any(~resolved)
    threshold = None
    scratch = None
    if any_full and _maybe_any(unresolved):
        w = full_weights()
        # The count search only matters for unresolved rows that have a top-k.
        k_radix = k if _maybe_any(unresolved & k_on) else None
        keys = radix_scratch(w)
        t = radix_threshold(w, k_radix, p, joint=joint, scratch=keys)
        # The int32 key buffer is free again: it holds the sampling mask later (a fresh
        # CPU allocation of this size costs as much as a pass over it).
        scratch = keys[0].view(torch.float32)
        threshold = torch.where(unresolved, t, torch.zeros_like(t))
    return FilterPlan(
        resolved=resolved,
        cand_idx=cand_idx,
        cand_weights=cand_weights,
        cand_threshold=cand_threshold,
        weights=weights if any_full else None,
        threshold=threshold,
        sums=sums,
        any_full=any_full,
        owns_weights=scores_are_logits,
        scratch=scratch,
    )


def sample_plan(plan: FilterPlan, uniforms: torch.Tensor) -> torch.Tensor:
    """Draw one token per row (int64) from a FilterPlan with one uniform per row."""
    tokens: torch.Tensor | None = None
    if plan.cand_idx is not None and plan.cand_weights is not None:
        cum = plan.cand_weights.cumsum(-1)
        pos = _first_above(cum, uniforms * cum[:, -1])
        tokens = plan.cand_idx.gather(1, pos.unsqueeze(1)).squeeze(1)
        # No distribution (NaN / all -inf): token 0, as on the full-vocabulary path.
        tokens = torch.where(cum[:, -1] > 0, tokens, torch.zeros_like(tokens))
    if plan.any_full:
        assert plan.weights is not None
        sums = plan.sums if plan.threshold is None else None
        full = sample_full(
            plan.weights,
            uniforms,
            plan.threshold,
            sums,
            owned=plan.owns_weights,
            scratch=plan.scratch,
        )
        tokens = full if tokens is None else torch.where(plan.resolved, tokens, full)
    assert tokens is not None
    return tokens


def sample(
    scores: torch.Tensor,
    top_k: torch.Tensor | int | None,
    top_p: torch.Tensor | float | None,
    uniforms: torch.Tensor,
    *,
    scores_are_logits: bool,
    inplace: bool = False,
    joint: bool = False,
) -> torch.Tensor:
    """Top-k / top-p sample of each row with its own uniform in [0, 1) (int64, B)."""
    scores = _as_float_matrix(scores, "logits" if scores_are_logits else "probs")
    batch, vocab = scores.shape
    if uniforms.shape != (batch,):
        raise ValueError(
            f"uniforms has shape {tuple(uniforms.shape)}; expected ({batch},)"
        )
    if batch == 0:
        return torch.empty(0, dtype=torch.int64, device=scores.device)
    k = normalize_top_k(top_k, batch, vocab, scores.device)
    p = normalize_top_p(top_p, batch, scores.device)
    plan = plan_filter(
        scores, k, p, scores_are_logits=scores_are_logits, inplace=inplace, joint=joint
    )
    return sample_plan(plan, uniforms)


def mask_logits(
    logits: torch.Tensor,
    top_k: torch.Tensor | int | None,
    top_p: torch.Tensor | float | None,
) -> torch.Tensor:
    """Set the logits of tokens outside top-k / top-p to -inf, in place; returns them.

    The same kept set as ``sample`` (vLLM's ``apply_top_k_top_p`` semantics), without
    sorting the vocabulary.
    """
    logits = _as_float_matrix(logits, "logits")
    batch, vocab = logits.shape
    k = normalize_top_k(top_k, batch, vocab, logits.device)
    p = normalize_top_p(top_p, batch, logits.device)
    if batch == 0 or (k is None and p is None):
        return logits
    plan = plan_filter(logits, k, p, scores_are_logits=True)
    assert plan.cand_threshold is not None
    drop = logits < plan.cand_threshold.unsqueeze(1)
    if plan.threshold is not None:
        assert plan.weights is not None
        by_weight = plan.weights < plan.threshold.unsqueeze(1)
        drop = torch.where(plan.resolved.unsqueeze(1), drop, by_weight)
    return logits.masked_fill_(drop, float("-inf"))


def _as_float_matrix(x: torch.Tensor, what: str) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError(
            f"{what} must be 2-D (batch, vocab); got shape {tuple(x.shape)}"
        )
    if x.shape[1] == 0:
        raise ValueError(f"{what} has an empty vocabulary dimension")
    if x.dtype != torch.float32:
        x = x.float()
    return x.contiguous()


# ---- flashinfer-compatible entry points -------------------------------------------


def _uniforms(batch: int, device: torch.device, generator: torch.Generator | None):
    return torch.rand(batch, device=device, generator=generator)


def _check_common(
    x: torch.Tensor,
    indices: torch.Tensor | None,
    filter_apply_order: str,
    check_nan: bool,
    what: str,
) -> torch.Tensor:
    if filter_apply_order not in _FILTER_ORDERS:
        raise ValueError(
            f"filter_apply_order={filter_apply_order!r} is not supported; use one of "
            f"{_FILTER_ORDERS}"
        )
    if indices is not None:
        x = x.index_select(0, indices.to(device=x.device, dtype=torch.int64))
    if check_nan and bool(torch.isnan(x).any()):  # opt-in: synchronises
        raise ValueError(f"{what} contain NaN (check_nan=True)")
    return x


def top_k_top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_k: torch.Tensor | int,
    top_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
) -> torch.Tensor:
    """flashinfer's ``top_k_top_p_sampling_from_probs``: int32 token per row."""
    return _flashinfer_style(
        probs, top_k, top_p, indices, filter_apply_order, generator, check_nan, "probs"
    )


def top_k_top_p_sampling_from_logits(
    logits: torch.Tensor,
    top_k: torch.Tensor | int,
    top_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
) -> torch.Tensor:
    """flashinfer's ``top_k_top_p_sampling_from_logits``: int32 token per row."""
    return _flashinfer_style(
        logits,
        top_k,
        top_p,
        indices,
        filter_apply_order,
        generator,
        check_nan,
        "logits",
    )


def _flashinfer_style(
    scores: torch.Tensor,
    top_k: torch.Tensor | int,
    top_p: torch.Tensor | float,
    indices: torch.Tensor | None,
    filter_apply_order: str,
    generator: torch.Generator | None,
    check_nan: bool,
    what: str,
) -> torch.Tensor:
    scores = _check_common(scores, indices, filter_apply_order, check_nan, what)
    uniforms = _uniforms(scores.shape[0], scores.device, generator)
    tokens = sample(
        scores,
        top_k,
        top_p,
        uniforms,
        scores_are_logits=what == "logits",
        joint=filter_apply_order == "joint",
    )
    return tokens.to(torch.int32)
