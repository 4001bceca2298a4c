"""Drawing one token per row from its kept set: inverse-transform sampling, no sort.

Why: the kept set (``kept_set``) says which tokens may be drawn; this module
draws them with one uniform per row, without a noise tensor of the vocabulary's size
(``Tensor.exponential_`` runs on the CPU on Kunlun) and without reading a device value
on the host.

How:
* Inverse transform: the token is the first index whose cumulative weight exceeds
  ``u * total``. The cumulative sum is two-level (sums of ``BLOCK``-token blocks, then
  one block), so the weights are read once. ``rows`` maps each draw to a weight row, so
  many draws from one distribution (flashinfer's ``indices``) read the row's block sums
  and one block each, never a copy of the row.
* Top-p by rejection (host only): a row with top-p and no top-k draws from its whole
  distribution; the drawn token is kept when the mass strictly above it is below
  ``top_p`` of the row's mass (one vectorised pass, the same test as the threshold's).
  A rejected row draws again, with a fresh uniform, from the tokens above the rejected
  one (the kept set lies there), so an accepted token follows the kept set's
  distribution exactly. Rows still rejected after the rounds their uniforms allow get
  the exact radix threshold and a last fresh uniform. On the CPU a histogram costs
  about 14 row reads; this test costs about one. Removable when the CPU path no longer
  matters.

A row with no distribution (NaN, all ``-inf`` logits, all-zero weights) yields token 0.
"""

from __future__ import annotations

import torch

from vllm_kunlun.ops.sampling import threshold as thresholds

# Block size of the two-level cumulative sum.
BLOCK = 512
# Elements per chunk of the rejection test (32 rows of 152K): a scratch of this size
# is reused by the allocator instead of being page-faulted in on every call (CPU).
CHECK_ELEMENTS = 1 << 22
# Draws per chunk when many draws share rows: bounds the (draws, BLOCK) gathers.
DRAW_CHUNK = 8192


def uniform_rows(uniforms: torch.Tensor, draws: int) -> torch.Tensor:
    """``uniforms`` as (draws, D): one row per draw, given as (draws,) or (draws, D)."""
    u = uniforms if uniforms.dim() == 2 else uniforms.unsqueeze(1)
    if uniforms.dim() not in (1, 2) or u.shape[0] != draws:
        raise ValueError(
            f"uniforms has shape {tuple(uniforms.shape)}; expected ({draws},) or "
            f"({draws}, D): one row of uniforms per draw"
        )
    return u


def first_above(cum: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose cumulative weight exceeds ``target``.

    Never lands on a zero-weight entry: ``target`` >= 0 skips leading zeros, and the
    result is capped at the last entry that adds weight (rounding can put ``target`` at
    or past the total). Rows without weight get some valid index; callers map them to
    token 0.
    """
    idx = torch.searchsorted(cum, target.unsqueeze(1), right=True)
    last = torch.searchsorted(cum, cum[:, -1:].contiguous())
    return torch.minimum(idx, last).squeeze(1).clamp_(0, cum.shape[1] - 1)


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


def draw_with_mass(
    weights: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    threshold: torch.Tensor | None = None,
    owned: bool = False,
    scratch: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-transform draw over whole rows: (tokens, int64, one per uniform; the
    (masked) mass each draw was taken from).

    ``weights`` (B, V) need not be normalised; with ``threshold`` (B,), weights below it
    count as 0 (zeroed in place when ``owned``; else written to ``scratch`` or a new
    buffer). ``rows`` (N,): the weight row of each of the N uniforms (None: N == B).
    Callers that want only the tokens take ``[0]``.
    """
    masked = weights
    if threshold is not None:
        # A float 0/1 mask written by the comparison itself: bool masks go through a
        # slow, unvectorised cast on the CPU (masked_fill_ costs ~7x more).
        keep = torch.empty_like(weights) if scratch is None else scratch
        torch.ge(weights, threshold.unsqueeze(1), out=keep)
        masked = weights.mul_(keep) if owned else keep.mul_(weights)
    sums = block_sums(masked)
    cum = sums.cumsum(-1)
    if rows is None:
        return _invert(masked, sums, cum, uniforms, None)
    # Many draws per row (flashinfer's indices): the rows' block sums are shared; the
    # per-draw work runs in chunks so its memory stays bounded.
    parts = [
        _invert(
            masked, sums, cum, uniforms[i : i + DRAW_CHUNK], rows[i : i + DRAW_CHUNK]
        )
        for i in range(0, rows.shape[0], DRAW_CHUNK)
    ]
    if not parts:
        empty = torch.empty(0, dtype=torch.int64, device=weights.device)
        return empty, empty.float()
    return torch.cat([t for t, _ in parts]), torch.cat([m for _, m in parts])


def _invert(
    masked: torch.Tensor,
    sums: torch.Tensor,
    cum: torch.Tensor,
    uniforms: torch.Tensor,
    rows: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse transform for draws ``uniforms`` on rows ``rows`` of ``masked``."""
    vocab = masked.shape[1]
    block = min(BLOCK, vocab)
    if rows is not None:
        sums = sums.index_select(0, rows)
        cum = cum.index_select(0, rows)
    target = uniforms * cum[:, -1]
    chosen = first_above(cum, target)
    before = cum.gather(1, chosen.unsqueeze(1)) - sums.gather(1, chosen.unsqueeze(1))
    rest = (target.unsqueeze(1) - before).clamp_(min=0).squeeze(1)
    cols = chosen.unsqueeze(1) * block + torch.arange(block, device=masked.device)
    valid = cols < vocab
    cols = cols.clamp_(max=vocab - 1)
    if rows is None:
        vals = masked.gather(1, cols)
    else:
        vals = masked.view(-1)[rows.unsqueeze(1) * vocab + cols]
    offset = first_above((vals * valid).cumsum(-1), rest)
    tokens = chosen * block + offset
    # No distribution (NaN / all -inf / all zero): token 0, documented. The mass is
    # summed again (not the running sum's end) for the top-p test's precision.
    total = cum[:, -1]
    tokens = torch.where(total > 0, tokens, torch.zeros_like(tokens))
    return tokens, sums.sum(-1)


def draw_candidates(
    cand_idx: torch.Tensor,
    cand_weights: torch.Tensor,
    uniforms: torch.Tensor,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Draw among each row's candidates (weights zero when filtered out), int64."""
    if rows is not None:
        cand_idx = cand_idx.index_select(0, rows)
        cand_weights = cand_weights.index_select(0, rows)
    cum = cand_weights.cumsum(-1)
    pos = first_above(cum, uniforms * cum[:, -1])
    tokens = cand_idx.gather(1, pos.unsqueeze(1)).squeeze(1)
    # No distribution (NaN / all -inf): token 0, as on the full-vocabulary path.
    return torch.where(cum[:, -1] > 0, tokens, torch.zeros_like(tokens))


def _mass_above(
    part: torch.Tensor, values: torch.Tensor, scratch: torch.Tensor
) -> torch.Tensor:
    """Per row of ``part``: the mass of weights strictly above ``values``."""
    above = scratch[: part.shape[0]]
    torch.gt(part, values.unsqueeze(1), out=above)
    return above.mul_(part).sum(-1)


def top_p_by_rejection(
    weights: torch.Tensor,
    tokens: torch.Tensor,
    deferred: torch.Tensor,
    top_p: torch.Tensor,
    total: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """Keep or redraw the token of each ``deferred`` row (host only), exactly.

    ``tokens`` were drawn from the whole distribution with ``uniforms[:, 0]``; columns
    1 .. D-2 serve further rounds, column D-1 the exact fallback. ``weights``: the
    unmasked probabilities of every row (read, never written); ``total``: their sums.
    The test runs over chunks of ``CHECK_ELEMENTS`` elements (a small scratch), then
    the rejected rows of all chunks go through the rounds together: few operations,
    each on many rows.
    """
    assert uniforms.shape[1] >= 2, "a rejected row needs a fresh uniform"
    out = tokens.clone()
    everyone = bool(deferred.all())
    index = torch.arange(weights.shape[0], device=weights.device)
    if not everyone:
        index = index[deferred]
    n = index.shape[0]
    step = max(1, CHECK_ELEMENTS // weights.shape[1])
    scratch = torch.empty(
        (min(n, step), weights.shape[1]), dtype=torch.float32, device=out.device
    )
    current = tokens[index]
    values = weights[index, current]
    total = total[index]
    # A token heavier than (1 - top_p) of its row is kept without a pass: the mass
    # above it is at most the row's mass minus its own (typical of peaked rows).
    mass = torch.zeros_like(values)
    unsure = (values <= (1 - top_p[index]) * total).nonzero().squeeze(1)
    slices = everyone and unsure.shape[0] == n
    for start in range(0, unsure.shape[0], step):
        end = min(unsure.shape[0], start + step)
        at = unsure[start:end]
        part = weights[start:end] if slices else weights[index[at]]
        mass[at] = _mass_above(part, values[at], scratch)
    for column in range(1, uniforms.shape[1]):
        # Kept: the mass strictly above the token is below top_p of the row (the max
        # token always; a row without distribution keeps its token 0).
        ok = (mass < top_p[index] * total) | (mass <= 0) | ~(total > 0)
        out[index[ok]] = current[ok]
        left = ~ok
        if not bool(left.any()):
            break
        index, values, total = index[left], values[left], total[left]
        last = column == uniforms.shape[1] - 1
        current, values, mass = _redraw(
            weights, index, values, top_p, uniforms[:, column], last, scratch
        )
        if last:
            out[index] = current
    return out


def _redraw(
    weights: torch.Tensor,
    index: torch.Tensor,
    values: torch.Tensor,
    top_p: torch.Tensor,
    uniform: torch.Tensor,
    last: bool,
    scratch: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fresh draw for rejected rows ``index`` (chunked like the test).

    Everything kept lies strictly above the rejected token's weight ``values``, so the
    draw is from there; ``last``: from the exact threshold instead (no test follows).
    Returns the tokens, their weights and the mass strictly above them.
    """
    tokens = torch.empty_like(index)
    new_values = torch.empty_like(values)
    mass = torch.empty_like(values)
    step = scratch.shape[0]
    for start in range(0, index.shape[0], step):
        end = min(index.shape[0], start + step)
        rows = index[start:end]
        sub = weights[rows]  # a copy of the rejected rows
        if last:
            exact = thresholds.radix_threshold(sub, None, top_p[rows])
            tokens[start:end] = draw_with_mass(
                sub, uniform[rows], threshold=exact, owned=True
            )[0]
            continue
        floor = torch.nextafter(
            values[start:end], torch.full_like(values[start:end], float("inf"))
        )
        picked = draw_with_mass(
            sub,
            uniform[rows],
            threshold=floor,
            owned=True,
            scratch=scratch[: end - start],
        )[0]
        tokens[start:end] = picked
        new_values[start:end] = sub[
            torch.arange(end - start, device=sub.device), picked
        ]
        mass[start:end] = _mass_above(sub, new_values[start:end], scratch)
    return tokens, new_values, mass
