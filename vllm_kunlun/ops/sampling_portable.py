"""Portable torch sampling with flashinfer's API and semantics (flashinfer 0.6.1).

Why: the vendor sampling kernel exists only on Kunlun, and requests with their own seed
cannot use it at all (it takes one generator per batch). This module is the sampler used
everywhere else: on the CPU, on other CUDA devices, for seeded rows, as the fallback of
the kernel seam (``ops/sampling.py``), and as the reference the vendor kernel is tested
against. Kernel developers get flashinfer's ``flashinfer.sampling`` functions with the
same arguments, dtypes and errors, on any device.

How (details in ``sampling_select`` and ``sampling_draw``): no sort of the vocabulary, no
host/device synchronisation, one uniform per row for the draw:
* the kept set is an exact per-row threshold: ``topk(128)`` candidates when a row's
  top-k fits in them, else a radix select over the float bits of the probabilities;
* the token is drawn by inverse transform over two-level block sums;
* on the CPU, a top-p row without top-k is decided at draw time (the drawn token is
  tested against the threshold's criterion, redrawn if outside), which reads the row
  about once instead of building histograms.

Semantics: top-k first, then top-p over the renormalised top-k distribution (flashinfer's
``filter_apply_order="top_k_first"``, vLLM's native order); ``"joint"``: top-p relative to
the whole distribution. ``top_k`` <= 0 or >= vocab: no top-k; ``top_p`` >= 1: no top-p;
``top_p`` <= 0 keeps only the most likely token(s). Ties at a threshold are kept; weights
are compared as float32 probabilities. A row whose logits contain NaN or are all
``-inf`` has no distribution and yields token 0, as vLLM's native sampler does
(checking would synchronise every step; ``check_nan=True`` raises instead). Uniforms
are float32: a token below ~6e-8 of its row's mass may be drawn slightly more or less
often than its probability. ``deterministic`` is accepted and ignored: the result
depends only on the inputs and the uniforms (on an accelerator, float atomics in the
radix histograms can move a token that sits within float rounding of the threshold).
"""

from __future__ import annotations

import torch

from vllm_kunlun.ops import sampling_draw as draw_ops
from vllm_kunlun.ops import sampling_rng as rng
from vllm_kunlun.ops import sampling_select as select
from vllm_kunlun.ops import sampling_shared as shared
from vllm_kunlun.ops.sampling_draw import BLOCK, block_sums
from vllm_kunlun.ops.sampling_select import (
    CANDIDATES,
    FilterPlan,
    normalize_top_k,
    normalize_top_p,
    plan_filter,
    radix_levels,
    radix_threshold,
)

__all__ = [
    "BLOCK",
    "CANDIDATES",
    "DRAWS",
    "FilterPlan",
    "block_sums",
    "chain_speculative_sampling",
    "mask_logits",
    "min_p_sampling_from_probs",
    "normalize_top_k",
    "normalize_top_p",
    "plan_filter",
    "radix_levels",
    "radix_threshold",
    "sample",
    "sampling_from_logits",
    "sampling_from_probs",
    "softmax",
    "top_k_mask_logits",
    "top_k_renorm_prob",
    "top_k_renorm_probs",
    "top_k_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
    "top_p_renorm_prob",
    "top_p_renorm_probs",
    "top_p_sampling_from_probs",
]

# Uniforms per row the callers draw: the draw, two rejection rounds (deferred top-p on
# the CPU), and the exact fallback after them.
DRAWS = 4
_FILTER_ORDERS = ("top_k_first", "joint")


def _as_float_matrix(x: torch.Tensor, what: str) -> torch.Tensor:
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
    scores = _as_float_matrix(scores, "logits" if scores_are_logits else "probs")
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
    return draw_ops.draw_plan(plan, u.to(torch.float32), rows)


def _filter(
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
    (``sampling_select.cut_boundary_ties``).
    """
    work = _as_float_matrix(logits, "logits")  # the tensor itself when float32
    batch = work.shape[0]
    p = normalize_top_p(top_p, batch, work.device)
    if p is None or batch == 0 or not select.maybe_any(p < 1):
        masked = _filter(work, top_k, None, scores_are_logits=True, fill=float("-inf"))
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
                top = _filter(sub, kk, None, scores_are_logits=True, fill=float("-inf"))
                return torch.logsumexp(top, dim=-1)

        masked = _filter(work, k, p, scores_are_logits=True, fill=float("-inf"))
        masked = select.cut_boundary_ties(masked, p, log_mass)
    if masked is not logits:
        logits.copy_(masked)
    return logits


# ---- flashinfer-compatible entry points -------------------------------------------


def _check_indices(
    indices: torch.Tensor | None, device: torch.device
) -> torch.Tensor | None:
    if indices is None:
        return None
    if not isinstance(indices, torch.Tensor) or indices.dim() != 1:
        raise ValueError("indices must be a 1D tensor of shape (batch_size,)")
    if indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"indices must be int32 or int64, got {indices.dtype}")
    return indices.to(device=device, dtype=torch.int64)


def _check_nan(x: torch.Tensor, what: str) -> None:
    if bool(torch.isnan(x).any()):  # opt-in: synchronises
        raise ValueError(f"Input {what} contains NaN.")


def _sample_api(
    scores: torch.Tensor,
    what: str,
    top_k: torch.Tensor | int | None,
    top_p: torch.Tensor | float | None,
    indices: torch.Tensor | None,
    generator: torch.Generator | None,
    check_nan: bool,
    seed: int | torch.Tensor | None,
    offset: int | torch.Tensor | None,
    filter_apply_order: str = "top_k_first",
) -> torch.Tensor:
    """flashinfer's sampling contract: one token per row of ``scores`` (or per entry of
    ``indices``), dtype int32 (or ``indices``' dtype), inputs untouched."""
    if filter_apply_order not in _FILTER_ORDERS:
        raise ValueError(
            f"Invalid filter_apply_order: {filter_apply_order!r}; use one of "
            f"{_FILTER_ORDERS}"
        )
    scores = _as_float_matrix(scores, what)
    out_dtype = indices.dtype if isinstance(indices, torch.Tensor) else torch.int32
    rows = _check_indices(indices, scores.device)
    batch, vocab = scores.shape
    draws = batch if rows is None else rows.shape[0]
    if draws == 0:
        return torch.empty(0, dtype=out_dtype, device=scores.device)
    # flashinfer's rule: a parameter is a scalar or one value per output row.
    k = normalize_top_k(top_k, draws, vocab, scores.device, strict=True)
    p = normalize_top_p(top_p, draws, scores.device, strict=True)
    if check_nan:
        _check_nan(scores, what)
    u = rng.uniforms(
        draws, DRAWS, scores.device, generator=generator, seed=seed, offset=offset
    )
    logits = what == "logits"
    joint = filter_apply_order == "joint"
    per_draw = isinstance(top_k, torch.Tensor) or isinstance(top_p, torch.Tensor)
    if rows is None:
        tokens = sample(scores, k, p, u, scores_are_logits=logits, joint=joint)
    elif not per_draw:
        # One filter for every draw: plan each score row once, draw per index.
        k_row = None if k is None else k[:1].expand(batch)
        p_row = None if p is None else p[:1].expand(batch)
        tokens = sample(
            scores, k_row, p_row, u, scores_are_logits=logits, joint=joint, rows=rows
        )
    else:
        # Each draw has its own filter: sort every row once, search per draw (no copy
        # of a row per draw).
        weights = select.probabilities(scores, scores_are_logits=logits)
        tokens = shared.sample_shared(weights, rows, u[:, 0], k=k, p=p, joint=joint)
    return tokens.to(out_dtype)


def sampling_from_probs(
    probs: torch.Tensor,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """flashinfer's ``sampling_from_probs``: one token per row (or per index)."""
    return _sample_api(
        probs, "probs", None, None, indices, generator, check_nan, seed, offset
    )


def sampling_from_logits(
    logits: torch.Tensor,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """flashinfer's ``sampling_from_logits``: sampling from ``softmax(logits)``."""
    return _sample_api(
        logits, "logits", None, None, indices, generator, check_nan, seed, offset
    )


def top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """flashinfer's ``top_p_sampling_from_probs`` (nucleus sampling)."""
    return _sample_api(
        probs, "probs", None, top_p, indices, generator, check_nan, seed, offset
    )


def top_k_sampling_from_probs(
    probs: torch.Tensor,
    top_k: torch.Tensor | int,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """flashinfer's ``top_k_sampling_from_probs``."""
    return _sample_api(
        probs, "probs", top_k, None, indices, generator, check_nan, seed, offset
    )


def top_k_top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_k: torch.Tensor | int,
    top_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """flashinfer's ``top_k_top_p_sampling_from_probs``."""
    return _sample_api(
        probs,
        "probs",
        top_k,
        top_p,
        indices,
        generator,
        check_nan,
        seed,
        offset,
        filter_apply_order,
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
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """flashinfer's ``top_k_top_p_sampling_from_logits``: as from ``softmax(logits)``."""
    return _sample_api(
        logits,
        "logits",
        top_k,
        top_p,
        indices,
        generator,
        check_nan,
        seed,
        offset,
        filter_apply_order,
    )


def min_p_sampling_from_probs(
    probs: torch.Tensor,
    min_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """flashinfer's ``min_p_sampling_from_probs``: keeps ``probs >= min_p * max``."""
    probs = _as_float_matrix(probs, "probs")
    out_dtype = indices.dtype if isinstance(indices, torch.Tensor) else torch.int32
    rows = _check_indices(indices, probs.device)
    draws = probs.shape[0] if rows is None else rows.shape[0]
    scale = select.normalize_top_p(min_p, draws, probs.device, strict=True)
    assert scale is not None
    if check_nan:
        _check_nan(probs, "probs")
    u = rng.uniforms(
        draws, 1, probs.device, generator=generator, seed=seed, offset=offset
    )
    if draws == 0:
        return torch.empty(0, dtype=out_dtype, device=probs.device)
    if rows is not None and isinstance(min_p, torch.Tensor):
        # One threshold per draw: sorted rows, searched per draw (no copy per draw).
        tokens = shared.sample_shared(probs, rows, u[:, 0], min_p=scale)
        return tokens.to(out_dtype)
    if rows is not None:
        scale = scale[:1].expand(probs.shape[0])
    threshold = scale * probs.amax(dim=-1)
    tokens = draw_ops.draw(probs, u[:, 0], threshold=threshold, rows=rows)
    return tokens.to(out_dtype)


def softmax(
    logits: torch.Tensor,
    temperature: torch.Tensor | float | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """flashinfer's ``softmax``: float32 probabilities of ``logits / temperature``.

    ``temperature``: a number or one float value per row; ``enable_pdl`` is a CUDA
    launch option, ignored.
    """
    logits = _as_float_matrix(logits, "logits")
    if temperature is None:
        return torch.softmax(logits, dim=-1)
    if isinstance(temperature, torch.Tensor):
        if temperature.dim() != 1:
            raise ValueError(
                "temperature tensor must be 1D with one value per logits row, got "
                f"shape {tuple(temperature.shape)}"
            )
        if temperature.shape[0] != logits.shape[0]:
            raise ValueError(
                f"temperature tensor length must equal logits.size(0) "
                f"({logits.shape[0]}), got {temperature.shape[0]}"
            )
        if temperature.device != logits.device:
            raise ValueError(
                f"temperature tensor must be on the same device as logits "
                f"({logits.device}), got {temperature.device}"
            )
        if not temperature.is_floating_point():
            raise ValueError(
                "temperature tensor must have dtype float16, bfloat16, float32, or "
                f"float64, got {temperature.dtype}"
            )
        return torch.softmax(logits / temperature.float().unsqueeze(1), dim=-1)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(
            "temperature must be None, a real scalar, or a 1D floating-point tensor "
            "with one value per logits row"
        )
    return torch.softmax(logits / float(temperature), dim=-1)


def _renorm(
    probs: torch.Tensor,
    top_k: torch.Tensor | int | None,
    top_p: torch.Tensor | float | None,
) -> torch.Tensor:
    original = probs.dtype
    kept = _filter(
        _as_float_matrix(probs, "probs").clone(),
        top_k,
        top_p,
        scores_are_logits=False,
        fill=0.0,
        strict=True,
    )
    return (kept / kept.sum(dim=-1, keepdim=True)).to(original)


def top_p_renorm_probs(
    probs: torch.Tensor, top_p: torch.Tensor | float
) -> torch.Tensor:
    """flashinfer's ``top_p_renorm_probs``: the nucleus of each row, renormalised."""
    return _renorm(probs, None, top_p)


def top_k_renorm_probs(probs: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """flashinfer's ``top_k_renorm_probs``: the top-k of each row (ties kept),
    renormalised; same dtype as ``probs``."""
    return _renorm(probs, top_k, None)


def top_k_mask_logits(logits: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """flashinfer's ``top_k_mask_logits``: a copy with non-top-k logits set to -inf,
    same dtype as ``logits``."""
    original = logits.dtype
    masked = _filter(
        _as_float_matrix(logits, "logits").clone(),
        top_k,
        None,
        scores_are_logits=True,
        fill=float("-inf"),
        strict=True,
    )
    return masked.to(original)


top_p_renorm_prob = top_p_renorm_probs
top_k_renorm_prob = top_k_renorm_probs


def chain_speculative_sampling(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """flashinfer's ``chain_speculative_sampling`` (speculative sampling, one chain of
    ``n`` draft tokens per request).

    Draft token i is accepted when ``u * draft_prob < target_prob``; the first rejected
    position gets a token drawn from ``relu(target - draft)``, or, when all drafts are
    accepted, a bonus token from the last target distribution; later positions are -1.
    Returns (output ids (B, n + 1) int32, accepted counts, emitted counts); the counts
    are added in place to the tensors given. The accepted count also counts drafts
    after the first rejection that would be accepted on their own (a fresh uniform each).
    """
    if draft_probs.dim() != 3 or draft_token_ids.dim() != 2 or target_probs.dim() != 3:
        raise ValueError(
            "expected draft_probs (batch, n, vocab), draft_token_ids (batch, n) and "
            f"target_probs (batch, n + 1, vocab); got {tuple(draft_probs.shape)}, "
            f"{tuple(draft_token_ids.shape)}, {tuple(target_probs.shape)}"
        )
    batch, n, vocab = draft_probs.shape
    if tuple(draft_token_ids.shape) != (batch, n) or tuple(target_probs.shape) != (
        batch,
        n + 1,
        vocab,
    ):
        raise ValueError(
            "expected draft_probs (batch, n, vocab), draft_token_ids (batch, n) and "
            f"target_probs (batch, n + 1, vocab); got {tuple(draft_probs.shape)}, "
            f"{tuple(draft_token_ids.shape)}, {tuple(target_probs.shape)}"
        )
    device = draft_probs.device
    draft = draft_probs.float()
    target = target_probs.float()
    ids = draft_token_ids.to(device=device, dtype=torch.int64)
    u = rng.uniforms(
        batch, 2 * n + 1, device, generator=generator, seed=seed, offset=offset
    )
    q = target[:, :n].gather(2, ids.unsqueeze(2)).squeeze(2)
    p = draft.gather(2, ids.unsqueeze(2)).squeeze(2)
    accept = u[:, :n] * p < q
    # First rejected position (n when all are accepted).
    pos = accept.to(torch.int64).cumprod(dim=1).sum(dim=1)
    positions = torch.arange(n, device=device).unsqueeze(0)
    again = (u[:, n : 2 * n] * p < q) & (positions >= pos.unsqueeze(1))
    accepted = pos + again.sum(dim=1)
    # Residual distribution at the first rejected position (the bonus: target only).
    index = pos.view(batch, 1, 1).expand(batch, 1, vocab)
    residual = target.gather(1, index).squeeze(1)
    drafted = draft.gather(1, index.clamp(max=max(n - 1, 0))).squeeze(1) if n else None
    if drafted is not None:
        residual = (residual - drafted * (pos < n).unsqueeze(1)).clamp_(min=0)
    token = draw_ops.draw(residual.contiguous(), u[:, 2 * n])
    out = torch.where(positions < pos.unsqueeze(1), ids, torch.full_like(ids, -1))
    out = torch.cat([out, torch.full_like(ids[:, :1], -1)], dim=1)
    out.scatter_(1, pos.unsqueeze(1), token.unsqueeze(1))
    if maybe_output_accepted_token_num is None:
        accepted_out = torch.zeros(batch, dtype=torch.int32, device=device)
    else:
        accepted_out = maybe_output_accepted_token_num
    if maybe_output_emitted_draft_token_num is None:
        emitted_out = torch.zeros(batch, dtype=torch.int32, device=device)
    else:
        emitted_out = maybe_output_emitted_draft_token_num
    accepted_out.add_(accepted.to(accepted_out.dtype))
    emitted_out.add_(pos.to(emitted_out.dtype))
    return out.to(torch.int32), accepted_out, emitted_out
