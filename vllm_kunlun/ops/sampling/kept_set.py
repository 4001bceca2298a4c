"""Which tokens a top-k / top-p filter keeps: the plan of every row, without sorting.

Why: the sampler, vLLM's ``apply_top_k_top_p`` and the flashinfer-style mask / renorm
functions all need the kept set of every row, decided before any random draw.

How:
* Kept set (vLLM's ``apply_top_k_top_p`` / flashinfer's ``top_k_first``): tokens whose
  weight is ``>=`` the k-th largest; then, over the renormalised top-k mass, the smallest
  set of most likely tokens whose mass reaches ``top_p`` (ties at the boundary kept).
  ``joint`` (flashinfer's other order): top-p relative to the whole row's mass.
* ``topk(CANDIDATES)`` first: a row with ``top_k <= CANDIDATES`` keeps a subset of its
  candidates (unless ties run past them), so nothing else of the row is read.
* Otherwise the exact radix threshold of ``threshold.py`` over the probabilities.
* ``cut_boundary_ties``: vLLM's count of tokens at a top-p tie, for ``apply_top_k_top_p``.

Removable: never; this is the portable implementation the vendor kernel is tested against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vllm_kunlun.ops.sampling import threshold as thresholds
from vllm_kunlun.ops.sampling.threshold import (
    probabilities,
    radix_scratch,
    radix_threshold,
)

# Candidates tried before the radix select. Static, so shapes never depend on data.
CANDIDATES = 128


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
    (see ``draw.top_p_by_rejection``); honoured on the host only.
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
    if defer_top_p and not joint and p is not None and thresholds.on_host(scores):
        deferred = p_on & ~k_on
        if not bool(deferred.any()):
            deferred = None

    # Candidates: only rows with a top-k can be decided by them (a top-p row needs its
    # total mass, i.e. the whole row, anyway).
    resolved = no_row
    cand_idx = cand_weights = cand_threshold = None
    if k is not None and thresholds.maybe_any(k_on & (k <= CANDIDATES)):
        wanted = k_on & (k <= CANDIDATES)
        ncand = min(vocab, CANDIDATES)
        if thresholds.on_host(k):
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
    any_full = thresholds.maybe_any(full_rows)
    threshold = None
    scratch = None
    if any_full:
        w = full_weights()
        exact = filtered & full_rows
        if deferred is not None:
            exact = exact & ~deferred
        if thresholds.maybe_any(exact):
            # The count search only matters for exact rows that have a top-k.
            k_radix = (
                k if k is not None and thresholds.maybe_any(exact & k_on) else None
            )
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
    if thresholds.on_host(logits):
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
