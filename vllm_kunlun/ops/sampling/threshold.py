"""Exact per-row keep-thresholds without sorting, and the inputs they work on.

Why: the kept set of a top-k / top-p row (``kept_set``) and the exact fallback of the
draw (``draw``) both need the threshold a filter implies; sorting a 152K-token row per
request is what made vLLM's native top-p slow, while a threshold found by selection is
exact and needs a fixed number of passes. This is the lowest module of the sampler: it
imports none of the others.

How:
* Parameters: ``normalize_top_k`` / ``normalize_top_p`` make one value per row
  (flashinfer's strict rule or vLLM's broadcast); weights are float32 probabilities
  (``probabilities``), so two logits that round to the same probability are a tie.
* A radix select over the float bits of the weights: per-row histograms of count or
  mass over 2 to 4 levels of bits, a fixed number of passes, no data-dependent control
  flow (``radix_select``, ``radix_threshold``).
* ``on_host``: on the CPU, where reading a tensor costs no synchronisation, stages no row
  needs are skipped; on an accelerator every stage runs (no host sync, static shapes).

Removable: never; this is the portable implementation the vendor kernel is tested against.
"""

from __future__ import annotations

import torch


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
