"""The portable torch sampler: top-k / top-p sampling and masking on any device.

Why: the vendor sampling kernel exists only on Kunlun, and requests with their own seed
cannot use it at all (it takes one generator per batch). This module is what the sampler
runs on everywhere else: on the CPU, on other CUDA devices, for seeded rows, and as the
fallback of the kernel seam (``seam.py``); the reference the vendor kernel is tested
against. flashinfer's API for kernel developers sits on top of it (``flashinfer_api.py``).

How, one way down: the kept set of each row is planned (``kept_set``), then drawn
(``draw``); both stand on ``threshold``. No sort of the vocabulary, no host/device
synchronisation, one uniform per row for the draw:
* the kept set is an exact per-row threshold: ``topk(128)`` candidates when a row's
  top-k fits in them, else a radix select over the float bits of the probabilities;
* the token is drawn by inverse transform over two-level block sums;
* on the CPU, a top-p row without top-k is decided at draw time (the drawn token is
  tested against the threshold's criterion, redrawn if outside), which reads the row
  about once instead of building histograms.

Semantics: top-k first, then top-p over the renormalised top-k distribution (flashinfer's
``filter_apply_order="top_k_first"``, vLLM's native order); ``joint``: top-p relative to
the whole distribution. ``top_k`` <= 0 or >= vocab: no top-k; ``top_p`` >= 1: no top-p;
``top_p`` <= 0 keeps only the most likely token(s). Ties at a threshold are kept; weights
are compared as float32 probabilities. A row whose logits contain NaN or are all
``-inf`` has no distribution and yields token 0, as vLLM's native sampler does
(checking would synchronise every step). Uniforms are float32: a token below ~6e-8 of
its row's mass may be drawn slightly more or less often than its probability. The
result depends only on the inputs and the uniforms (on an accelerator, float atomics in
the radix histograms can move a token that sits within float rounding of the threshold).
"""

from __future__ import annotations

import torch

from vllm_kunlun.ops.sampling import draw as draw_ops
from vllm_kunlun.ops.sampling import kept_set
from vllm_kunlun.ops.sampling.kept_set import FilterPlan, plan_filter
from vllm_kunlun.ops.sampling.threshold import (
    maybe_any,
    normalize_top_k,
    normalize_top_p,
)

# Uniforms per row the callers draw: the draw, two rejection rounds (deferred top-p on
# the CPU), and the exact fallback after them.
DRAWS = 4


def as_float_matrix(x: torch.Tensor, what: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(
            f"{what} must be 2-D (batch, vocab); got shape {tuple(x.shape)}"
        )
    if x.shape[1] == 0:
        raise ValueError(f"{what} has an empty vocabulary dimension")
    if x.dtype != torch.float32:
        x = x.float()
    return x.contiguous()


def sample(
    scores: torch.Tensor,
    top_k: torch.Tensor | int | None,
    top_p: torch.Tensor | float | None,
    uniforms: torch.Tensor,
    *,
    scores_are_logits: bool,
    inplace: bool = False,
    joint: bool = False,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Top-k / top-p sample, one token per draw (int64).

    ``scores`` (B, V): logits or probabilities (``inplace``: logits may be overwritten).
    ``uniforms``: (N,) or (N, D) in [0, 1), one row per draw; with D >= 2 the extra
    columns let the CPU decide top-p rows by rejection (``DRAWS`` is what callers
    draw). ``rows`` (N,): the score row of each draw (None: N == B). ``top_k`` /
    ``top_p``: a number, or a tensor of one value per score row (a single value
    broadcasts, as in vLLM).
    """
    scores = as_float_matrix(scores, "logits" if scores_are_logits else "probs")
    batch, vocab = scores.shape
    draws = batch if rows is None else rows.shape[0]
    u = draw_ops.uniform_rows(uniforms, draws)
    if draws == 0:
        return torch.empty(0, dtype=torch.int64, device=scores.device)
    k = normalize_top_k(top_k, batch, vocab, scores.device)
    p = normalize_top_p(top_p, batch, scores.device)
    plan = plan_filter(
        scores,
        k,
        p,
        scores_are_logits=scores_are_logits,
        inplace=inplace,
        joint=joint,
        defer_top_p=rows is None and u.shape[1] >= 2,
    )
    return draw_plan(plan, u.to(torch.float32), rows)


def filter_scores(
    scores: torch.Tensor,
    top_k: torch.Tensor | int | None,
    top_p: torch.Tensor | float | None,
    *,
    scores_are_logits: bool,
    fill: float,
    strict: bool = False,
) -> torch.Tensor:
    """``scores`` with every token outside the kept set set to ``fill``, in place."""
    batch, vocab = scores.shape
    k = normalize_top_k(top_k, batch, vocab, scores.device, strict)
    p = normalize_top_p(top_p, batch, scores.device, strict)
    if batch == 0 or (k is None and p is None):
        return scores
    plan = plan_filter(scores, k, p, scores_are_logits=scores_are_logits)
    drop: torch.Tensor | None = None
    if plan.cand_threshold is not None:
        drop = scores < plan.cand_threshold.unsqueeze(1)
    if plan.threshold is not None:
        assert plan.weights is not None
        by_weight = plan.weights < plan.threshold.unsqueeze(1)
        drop = (
            by_weight
            if drop is None
            else torch.where(plan.resolved.unsqueeze(1), drop, by_weight)
        )
    return scores if drop is None else scores.masked_fill_(drop, fill)


def mask_logits(
    logits: torch.Tensor,
    top_k: torch.Tensor | int | None,
    top_p: torch.Tensor | float | None,
) -> torch.Tensor:
    """Set the logits of tokens outside top-k / top-p to -inf, in place; returns them.

    vLLM's ``apply_top_k_top_p`` without sorting; a ``top_k`` / ``top_p`` tensor of a
    single value applies to every row. The kept set is ``sample``'s, except at a tie
    on the top-p boundary: ``sample`` keeps the whole tie group (FlashInfer's rule),
    this keeps vLLM's count of tokens, the lowest-indexed ties first
    (``sampling_kept_set.cut_boundary_ties``).
    """
    work = as_float_matrix(logits, "logits")  # the tensor itself when float32
    batch = work.shape[0]
    p = normalize_top_p(top_p, batch, work.device)
    if p is None or batch == 0 or not maybe_any(p < 1):
        masked = filter_scores(
            work, top_k, None, scores_are_logits=True, fill=float("-inf")
        )
    else:
        k = normalize_top_k(top_k, batch, work.shape[1], work.device)
        # The cut needs the mass top-p is relative to (the top-k set's, or the row's),
        # which masking overwrites: kept aside, and computed for the rows cut only.
        if k is None:
            total = torch.logsumexp(work, dim=-1)

            def log_mass(rows: torch.Tensor | None) -> torch.Tensor:
                return total if rows is None else total[rows]

        else:
            original = work.clone()

            def log_mass(rows: torch.Tensor | None) -> torch.Tensor:
                sub = original if rows is None else original[rows]
                assert k is not None
                kk = k if rows is None else k[rows]
                top = filter_scores(
                    sub, kk, None, scores_are_logits=True, fill=float("-inf")
                )
                return torch.logsumexp(top, dim=-1)

        masked = filter_scores(work, k, p, scores_are_logits=True, fill=float("-inf"))
        masked = kept_set.cut_boundary_ties(masked, p, log_mass)
    if masked is not logits:
        logits.copy_(masked)
    return logits


def draw_plan(
    plan: FilterPlan, uniforms: torch.Tensor, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """One token per row of ``uniforms`` (N, D) from a FilterPlan (int64, N).

    Column 0 is the draw; further columns serve deferred top-p rows (rejection rounds,
    then the exact fallback). ``rows``: weight row of each draw (no deferred rows then).
    """
    first = uniforms[:, 0]
    tokens: torch.Tensor | None = None
    if plan.cand_idx is not None and plan.cand_weights is not None:
        tokens = draw_ops.draw_candidates(plan.cand_idx, plan.cand_weights, first, rows)
    if plan.any_full:
        assert plan.weights is not None
        full, mass = draw_ops.draw_with_mass(
            plan.weights,
            first,
            threshold=plan.threshold,
            owned=plan.owns_weights,
            scratch=plan.scratch,
            rows=rows,
        )
        resolved = plan.resolved if rows is None else plan.resolved[rows]
        tokens = full if tokens is None else torch.where(resolved, tokens, full)
        if plan.deferred is not None:
            assert rows is None and plan.top_p is not None
            # Deferred rows have no threshold: ``mass`` is their whole mass.
            tokens = draw_ops.top_p_by_rejection(
                plan.weights, tokens, plan.deferred, plan.top_p, mass, uniforms
            )
    assert tokens is not None
    return tokens
