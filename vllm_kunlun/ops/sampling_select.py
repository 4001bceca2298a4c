"""Which tokens a top-k / top-p filter keeps: exact per-row thresholds, without sorting.

Why: the sampler, vLLM's ``apply_top_k_top_p`` and the flashinfer-style mask / renorm
functions all need the kept set of every row. Sorting a 152K-token row per request is
what made vLLM's native top-p slow; a threshold found by selection is exact and needs a
fixed number of passes.

How:
* Kept set (vLLM's ``apply_top_k_top_p`` / flashinfer's ``top_k_first``): tokens whose
  weight is ``>=`` the k-th largest; then, over the renormalised top-k mass, the smallest
  set of most likely tokens whose mass reaches ``top_p`` (ties at the boundary kept).
  ``joint`` (flashinfer's other order): top-p relative to the whole row's mass.
* Weights are probabilities in float32 (the softmax of logits), so two logits that round
  to the same probability are a tie.
* ``topk(CANDIDATES)`` first: a row with ``top_k <= CANDIDATES`` keeps a subset of its
  candidates (unless ties run past them), so nothing else of the row is read.
* Otherwise a radix select over the float bits of the weights: per-row histograms of
  count or mass over 2 to 4 levels of bits, a fixed number of passes, no data-dependent
  control flow.
* ``on_host``: on the CPU, where reading a tensor costs no synchronisation, stages no row
  needs are skipped; on an accelerator every stage runs (no host sync, static shapes).

Removable: never; this is the portable implementation the vendor kernel is tested against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# Candidates tried before the radix select. Static, so shapes never depend on data.
CANDIDATES = 128


def on_host(t: torch.Tensor) -> bool:
    """Whether reading ``t``'s values is free (CPU); tests patch this to simulate a device."""
    return t.device.type == "cpu"


def maybe_any(mask: torch.Tensor) -> bool:
    """``mask.any()`` on the host; True on an accelerator, where reading it would sync."""
    if on_host(mask):
        return bool(mask.any())
    return True


# ---- sampling parameters ------------------------------------------------------------


def _param(
    x: torch.Tensor | float | None,
    batch: int,
    name: str,
    dtype: torch.dtype,
    device: torch.device,
    strict: bool,
) -> torch.Tensor | None:
    """One value per row, or None. ``strict``: flashinfer's rule (a scalar or exactly
    ``(batch,)``); otherwise vLLM's (a tensor of one value broadcasts)."""
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        if isinstance(x, bool):
            raise TypeError(f"{name} must be a number or a tensor, got a bool")
        return torch.full((batch,), x, dtype=dtype, device=device)
    if strict:
        if x.dim() == 0:
            raise ValueError(
                f"Expected a 1D tensor of shape (batch_size,) or scalar for {name}, "
                "got a 0-dimensional tensor"
            )
        if x.dim() > 1:
            raise ValueError(
                f"Expected a 1D tensor or scalar for {name}, got a {x.dim()}D tensor"
            )
        if x.shape[0] != batch:
            raise ValueError(
                f"Sampling parameter tensor batch size mismatch: {name} has "
                f"{x.shape[0]} values for a batch of {batch}; pass one value per row "
                "or a scalar"
            )
        return x.to(device=device, dtype=dtype)
    if x.numel() == 1 and x.dim() <= 2:
        return x.reshape(1).to(device=device, dtype=dtype).expand(batch)
    if x.shape not in ((batch,), (batch, 1)):
        raise ValueError(
            f"{name} has shape {tuple(x.shape)}; expected ({batch},), one value per "
            "row, or a single value for every row"
        )
    return x.reshape(batch).to(device=device, dtype=dtype)


def normalize_top_k(
    top_k: torch.Tensor | int | None,
    batch: int,
    vocab: int,
    device: torch.device,
    strict: bool = False,
) -> torch.Tensor | None:
    """int64 (batch,) with ``vocab`` for "no top-k" (``<= 0`` or ``>= vocab``), or None."""
    k = _param(top_k, batch, "top_k", torch.int64, device, strict)
    if k is None:
        return None
    return torch.where((k <= 0) | (k > vocab), vocab, k)


def normalize_top_p(
    top_p: torch.Tensor | float | None,
    batch: int,
    device: torch.device,
    strict: bool = False,
) -> torch.Tensor | None:
    """float32 (batch,), values >= 1 meaning "no top-p", or None."""
    return _param(top_p, batch, "top_p", torch.float32, device, strict)


def probabilities(
    scores: torch.Tensor, *, scores_are_logits: bool, inplace: bool = False
) -> torch.Tensor:
    """The weights every selection works on: float32 probabilities.

    Logits go through one softmax (per row: max, exp, normalise while the row is in
    cache). ``inplace`` on the host writes them over the logits: a fresh CPU buffer of
    this size costs more in page faults than the softmax itself. Probability input is
    used as given (it need not be normalised).
    """
    if not scores_are_logits:
        return scores
    if inplace and on_host(scores):
        return torch._softmax(scores, -1, False, out=scores)
    return torch.softmax(scores, dim=-1)


# ---- radix select --------------------------------------------------------------------


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


def radix_scratch(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int32, int64) key buffers for ``radix_select`` on ``weights``."""
    return (
        torch.empty(weights.shape, dtype=torch.int32, device=weights.device),
        torch.empty(weights.shape, dtype=torch.int64, device=weights.device),
    )


def radix_select(
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
    met (+inf) gives T = 0, i.e. keep everything; ``fraction <= 0`` keeps the largest
    weight(s). ``weights``: contiguous non-negative float32 (B, V). Returns (T as
    float32, mass of weights >= T as float64).
    """
    by_count = count is not None
    batch = weights.shape[0]
    device = weights.device
    bits = weights.view(torch.int32)
    # Keys are computed in int32 (half the memory traffic), then copied into the int64
    # index that scatter_add_ requires; both buffers are reused across levels. Keys
    # count down from the largest value, so a plain cumsum of a histogram is the mass
    # (or count) of all tokens at or above each bin. Cumulative masses are float64: a
    # float32 running sum over thousands of bins drifts by more than one token's mass
    # in a flat 128K-token row, which would move the boundary.
    key32, key = scratch if scratch is not None else radix_scratch(weights)
    prefix = torch.zeros(batch, dtype=torch.int64, device=device)
    ones = torch.ones(1, dtype=torch.float32, device=device).expand(weights.shape)
    target = count.to(torch.float64) if count is not None else None
    levels = radix_levels(weights.shape[1])
    widest = batch * (max(1 << width for _, width in levels) + 2)
    hist_buf = torch.empty(widest, dtype=torch.float32, device=device)
    count_buf = torch.empty_like(hist_buf) if by_count else None
    last = len(levels) - 1
    cum_mass = torch.zeros((batch, 1), dtype=torch.float64, device=device)
    # Mass strictly above the bin chosen so far. The scatter also sums it (into the
    # "above" bin of the next level), but sequentially in float32 over most of the
    # row, which is too coarse; this float64 value replaces it.
    above = torch.zeros(batch, dtype=torch.float64, device=device)
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
            hist = hist_buf[: batch * total_bins].view(batch, total_bins)
            hist.zero_().scatter_add_(1, key, weights)
            if level > 0 and not by_count:
                hist[:, 0] = 0
            cum_mass = hist.double().cumsum_(1).add_(above.unsqueeze(1))
        if count_buf is not None:
            cum_count = count_buf[: batch * total_bins].view(batch, total_bins)
            cum_count.zero_().scatter_add_(1, key, ones).cumsum_(1)
            criterion = cum_count.double()
        else:
            if level == 0:
                assert fraction is not None
                total = cum_mass[:, -1]
                if base is not None:
                    total = torch.where(torch.isnan(base), total, base.double())
                # A positive target: top_p <= 0 keeps the largest weight(s).
                target = (fraction.double() * total).clamp_(min=1e-300)
            criterion = cum_mass
        assert target is not None
        # First (largest-value) bin whose cumulative count/mass reaches the target;
        # none reaches it -> the lowest bin, i.e. keep everything.
        first = torch.searchsorted(criterion, target.unsqueeze(1)).squeeze(1)
        first = first.sub_(offset).clamp_(0, nbins - 1)
        prefix = (prefix << width) | (nbins - 1 - first)
        if not by_count:
            before = (first + offset - 1).clamp(min=0).unsqueeze(1)
            above = torch.where(
                first + offset > 0, cum_mass.gather(1, before).squeeze(1), above
            )
    mass_ge = cum_mass.gather(1, (first + offset).unsqueeze(1)).squeeze(1)
    threshold = prefix.to(torch.int32).view(torch.float32)
    return threshold, mass_ge


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
        threshold, mass_k = radix_select(weights, count=k, scratch=scratch)
        if not joint:
            base = torch.where(k < vocab, mass_k, torch.full_like(mass_k, float("nan")))
    if p is not None:
        fraction = torch.where(p < 1, p, torch.full_like(p, float("inf")))
        t_p, _ = radix_select(weights, fraction=fraction, base=base, scratch=scratch)
        threshold = torch.maximum(threshold, t_p)
    return threshold


# ---- candidates ---------------------------------------------------------------------

# Block size of the candidate search: the top-n values of a row lie in the n blocks
# with the largest maxima.
CANDIDATE_BLOCK = 512


def top_candidates(scores: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``scores.topk(n)`` (values descending, indices), reading fewer elements.

    Every one of the n largest values lies in one of the n blocks with the largest
    maxima (the maxima of those blocks are n values at least as large), so one pass of
    block maxima and a topk over n blocks (plus the short last block) replace a topk
    over the row. With ties at the n-th value a tied element may be left out; the n-th
    candidate then equals the k-th value, which ``plan_filter``'s tie check sends to
    the radix select.
    """
    batch, vocab = scores.shape
    block = CANDIDATE_BLOCK
    full = vocab // block
    if full <= 2 * n:
        return scores.topk(n, dim=-1)
    main = full * block
    blocks = scores[:, :main].unflatten(1, (full, block))
    chosen = blocks.amax(-1).topk(n, dim=-1).indices
    picked = blocks.gather(1, chosen.unsqueeze(2).expand(batch, n, block))
    values = torch.cat([picked.flatten(1), scores[:, main:]], dim=1)
    cand, pos = values.topk(n, dim=-1)
    in_block = pos < n * block
    first = chosen.gather(1, (pos // block).clamp(max=n - 1)) * block + pos % block
    return cand, torch.where(in_block, first, pos - n * block + main)


# ---- the plan ------------------------------------------------------------------------


@dataclass
class FilterPlan:
    """The kept set of every row of one batch, before any random draw.

    ``resolved`` rows are decided by their ``CANDIDATES`` candidates (``cand_idx`` with
    weights ``cand_weights``, zero when filtered out) and keep exactly the tokens
    scoring ``>= cand_threshold`` in the caller's score space. Every other row uses the
    probabilities ``weights`` over the whole vocabulary: keep-threshold ``threshold``
    (None: keep all), or, for ``deferred`` rows (host only), top-p decided when a token
    is drawn: the token is kept when the mass strictly above it is below ``top_p`` of
    the row's mass.
    ``sums``: block sums of the unmasked weights when already computed.
    """

    resolved: torch.Tensor
    cand_idx: torch.Tensor | None
    cand_weights: torch.Tensor | None
    cand_threshold: torch.Tensor | None
    weights: torch.Tensor | None
    threshold: torch.Tensor | None
    any_full: bool
    owns_weights: bool = False
    deferred: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    scratch: torch.Tensor | None = None


def plan_filter(
    scores: torch.Tensor,
    k: torch.Tensor | None,
    p: torch.Tensor | None,
    *,
    scores_are_logits: bool,
    inplace: bool = False,
    joint: bool = False,
    defer_top_p: bool = False,
) -> FilterPlan:
    """Decide the kept set of every row. ``k``/``p`` come from normalize_top_k/_p.

    ``inplace`` (logits only): the probabilities may overwrite ``scores`` (then only
    ``cand_threshold`` of resolved rows still refers to the logits' values, which were
    read before). ``defer_top_p``: rows with top-p and no top-k are left to the draw
    (see ``sampling_draw.top_p_by_rejection``); honoured on the host only.
    """
    batch, vocab = scores.shape
    device = scores.device
    weights: torch.Tensor | None = None

    def full_weights() -> torch.Tensor:
        nonlocal weights
        if weights is None:
            weights = probabilities(
                scores, scores_are_logits=scores_are_logits, inplace=inplace
            )
        return weights

    owned = scores_are_logits
    if k is None and p is None:
        return FilterPlan(
            resolved=torch.zeros(batch, dtype=torch.bool, device=device),
            cand_idx=None,
            cand_weights=None,
            cand_threshold=None,
            weights=full_weights(),
            threshold=None,
            any_full=True,
            owns_weights=owned,
        )

    no_row = torch.zeros(batch, dtype=torch.bool, device=device)
    k_on = no_row if k is None else k < vocab
    p_on = no_row if p is None else p < 1
    filtered = k_on | p_on
    deferred: torch.Tensor | None = None
    if defer_top_p and not joint and p is not None and on_host(scores):
        deferred = p_on & ~k_on
        if not bool(deferred.any()):
            deferred = None

    # Candidates: only rows with a top-k can be decided by them (a top-p row needs its
    # total mass, i.e. the whole row, anyway).
    resolved = no_row
    cand_idx = cand_weights = cand_threshold = None
    if k is not None and maybe_any(k_on & (k <= CANDIDATES)):
        wanted = k_on & (k <= CANDIDATES)
        ncand = min(vocab, CANDIDATES)
        if on_host(k):
            # On the host the largest top-k that candidates serve is known: fewer
            # candidates, fewer blocks to read (one more than k shows a tie at k).
            ncand = min(ncand, 1 + int(torch.where(wanted, k, 0).max()))
        every = ncand == vocab
        cand, cand_idx = top_candidates(scores, ncand)
        lowest = cand[:, -1]
        # Relative weights in the caller's space; only ratios matter below, except
        # against the total mass (joint), for which the probabilities are used.
        cand_w = (cand - cand[:, :1]).exp() if scores_are_logits else cand
        t_k = cand.gather(1, (k.clamp(max=ncand) - 1).unsqueeze(1)).squeeze(1)
        kept = cand >= t_k.unsqueeze(1)
        resolved = k_on & (k <= ncand) & ((lowest < t_k) | every)
        cand_threshold = t_k
        if p is not None:
            csum = (cand_w * kept).cumsum(-1)
            mass = csum[:, -1]
            if joint:
                w = full_weights()
                total = w.sum(-1)
                # The same scale as cand_w: probabilities of the candidates.
                cand_w = w.gather(1, cand_idx)
                csum = (cand_w * kept).cumsum(-1)
                mass = total
            j = (csum < (p * mass).unsqueeze(1)).sum(-1)
            t_p = cand.gather(1, j.clamp(max=ncand - 1).unsqueeze(1)).squeeze(1)
            # j past the kept candidates: the nucleus is larger than the top-k set.
            use_p = p_on & (j < ncand)
            kept = kept & ((cand >= t_p.unsqueeze(1)) | ~use_p.unsqueeze(1))
            cand_threshold = torch.where(
                use_p, torch.maximum(cand_threshold, t_p), cand_threshold
            )
        cand_weights = cand_w * kept
        # Only resolved rows are masked by the candidates' threshold.
        cand_threshold = torch.where(
            resolved, cand_threshold, torch.full_like(cand_threshold, float("-inf"))
        )

    full_rows = ~resolved
    any_full = maybe_any(full_rows)
    threshold = None
    scratch = None
    if any_full:
        w = full_weights()
        exact = filtered & full_rows
        if deferred is not None:
            exact = exact & ~deferred
        if maybe_any(exact):
            # The count search only matters for exact rows that have a top-k.
            k_radix = k if k is not None and maybe_any(exact & k_on) else None
            p_radix = p
            if deferred is not None and p is not None:
                p_radix = torch.where(deferred, torch.ones_like(p), p)
            keys = radix_scratch(w)
            t = radix_threshold(w, k_radix, p_radix, joint=joint, scratch=keys)
            # The int32 key buffer is free again: it holds the sampling mask later (a
            # fresh CPU allocation of this size costs as much as a pass over it).
            scratch = keys[0].view(torch.float32)
            threshold = torch.where(exact, t, torch.zeros_like(t))
    return FilterPlan(
        resolved=resolved,
        cand_idx=cand_idx,
        cand_weights=cand_weights,
        cand_threshold=cand_threshold,
        weights=weights if any_full else None,
        threshold=threshold,
        any_full=any_full,
        owns_weights=owned,
        deferred=deferred,
        top_p=None if deferred is None else p,
        scratch=scratch,
    )


# ---- vLLM's top-p count at a tie -----------------------------------------------------


def cut_boundary_ties(
    logits: torch.Tensor,
    p: torch.Tensor,
    log_mass: Callable[[torch.Tensor | None], torch.Tensor],
) -> torch.Tensor:
    """Keep only as many boundary ties as vLLM's ``apply_top_k_top_p`` keeps, in place.

    Why: ``logits`` come masked by the threshold rule (every token tied with the
    lowest kept logit is kept, as FlashInfer's kernels do). vLLM's sort-based top-p
    instead walks the sorted row and stops at the first token whose predecessors reach
    ``p``: of a tie group straddling the boundary it keeps only the first tokens its
    (unstable) sort happens to put there. The count is what vLLM determines, so it is
    kept here; the tokens kept are the lowest-indexed of the group.

    ``log_mass(rows)``: for rows ``rows`` (None: all), the logsumexp of the row after
    top-k, before top-p (the mass top-p is relative to); ``p`` (B,) float32, >= 1 meaning no top-p. No host read on an
    accelerator; on the host only rows with a tie at their boundary are touched.
    """
    lowest = torch.where(logits > float("-inf"), logits, float("inf")).amin(-1)
    tie = logits == lowest.unsqueeze(1)
    ties = tie.sum(-1)
    rows: torch.Tensor | None = None
    if on_host(logits):
        wanted = (p < 1) & (ties > 1)
        if not bool(wanted.any()):
            return logits
        rows = wanted.nonzero().squeeze(1)
        x, tie, ties = logits[rows], tie[rows], ties[rows]
        lowest, p = lowest[rows], p[rows]
    else:
        x = logits
    mass = log_mass(rows)
    lm = mass.unsqueeze(1)
    # Mass strictly above the boundary and one tied token's mass, both relative to the
    # top-k mass; the j-th tie (0-based) is kept while above + j * tied < p.
    above = torch.where(x > lowest.unsqueeze(1), (x - lm).exp(), 0.0).sum(-1)
    tied = (lowest - mass).exp()
    need = (p.double() - above.double()) / tied.double()
    count = torch.minimum(need.ceil().clamp(min=1), ties.double())
    count = torch.where(torch.isfinite(need) & (p < 1), count, ties.double()).long()
    drop = tie & (tie.cumsum(-1) > count.unsqueeze(1))
    if rows is None:
        return logits.masked_fill_(drop, float("-inf"))
    logits[rows] = x.masked_fill_(drop, float("-inf"))
    return logits
