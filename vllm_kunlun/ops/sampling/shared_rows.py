"""Many draws from shared rows, each draw with its own filter (flashinfer's ``indices``
with per-draw ``top_k`` / ``top_p`` / ``min_p`` tensors).

Why: a draw with its own filter cannot reuse another draw's kept set, and gathering the
row of every draw copies ``len(indices)`` rows: 20,000 draws from one 32K row were 2.4
GiB of copies (``min_p``: in one allocation).

How: every score row is sorted once (weights descending, their token ids, float64 mass
per ``BLOCK``-token block), a copy the size of the input whatever the number of draws.
A draw's kept set is then a prefix of its row's sorted order: the same set as the
threshold rule of ``kept_set`` (``weight >= T``, ties kept), found by binary
searches over the block boundaries and one gathered block per search; the token is one
more search (inverse transform over the prefix). Per draw that is a few ``BLOCK``-sized
gathers, in chunks of ``DRAW_CHUNK`` draws.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vllm_kunlun.ops.sampling.draw import BLOCK, DRAW_CHUNK


@dataclass
class SortedRows:
    """Rows sorted once for per-draw searches.

    ``values`` (B, W): weights descending, padded with -inf to W = blocks * block;
    ``ids`` (B, V): their token ids; ``before`` (B, blocks + 1) float64: the mass of
    the blocks before each block (last column: the row's mass).
    """

    values: torch.Tensor
    ids: torch.Tensor
    before: torch.Tensor
    block: int
    vocab: int

    @property
    def blocks(self) -> int:
        return self.values.shape[1] // self.block


def sort_rows(weights: torch.Tensor) -> SortedRows:
    """``weights`` (B, V) non-negative, sorted descending once."""
    batch, vocab = weights.shape
    block = min(BLOCK, vocab)
    blocks = -(-vocab // block)
    values, ids = weights.sort(dim=-1, descending=True)
    padded = torch.full((batch, blocks * block), float("-inf"), device=weights.device)
    padded[:, :vocab] = values
    sums = torch.where(padded > 0, padded, 0.0).view(batch, blocks, block)
    before = torch.zeros(batch, blocks + 1, dtype=torch.float64, device=weights.device)
    before[:, 1:] = sums.sum(-1, dtype=torch.float64).cumsum(-1)
    return SortedRows(padded, ids, before, block, vocab)


def _blocks_of(s: SortedRows, rows: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(N, block) values of block ``b`` of row ``rows`` (b < blocks)."""
    start = rows * s.values.shape[1] + b * s.block
    cols = torch.arange(s.block, device=rows.device)
    return s.values.view(-1)[start.unsqueeze(1) + cols]


def _search(
    s: SortedRows,
    rows: torch.Tensor,
    target: torch.Tensor,
    coarse: torch.Tensor,
    fine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    right: bool,
) -> torch.Tensor:
    """``searchsorted`` of ``target`` in an ascending per-row sequence, two levels.

    ``coarse`` (N, blocks): each block's last element; ``fine(rows, b)`` (N, block):
    the elements of block ``b``. Returns positions in [0, blocks * block].
    """
    b = torch.searchsorted(coarse, target.unsqueeze(1), right=right).squeeze(1)
    inside = b < s.blocks
    bc = b.clamp(max=s.blocks - 1)
    inner = torch.searchsorted(fine(rows, bc), target.unsqueeze(1), right=right)
    pos = bc * s.block + inner.squeeze(1)
    return torch.where(inside, pos, s.blocks * s.block)


def _count_at_least(
    s: SortedRows, rows: torch.Tensor, t: torch.Tensor, ends: torch.Tensor
) -> torch.Tensor:
    """Per draw, how many weights of its row are ``>= t`` (``ends``: -block ends)."""
    return _search(
        s, rows, -t, ends, lambda r, b: _blocks_of(s, r, b).neg(), right=True
    )


def _inclusive(s: SortedRows, rows: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(N, block) float64 cumulative mass through each element of block ``b``."""
    vals = _blocks_of(s, rows, b).clamp(min=0).double()
    return s.before[rows, b].unsqueeze(1) + vals.cumsum(-1)


def _mass_of_first(s: SortedRows, rows: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Per draw, the mass of its row's ``n`` heaviest weights (float64)."""
    b = (n // s.block).clamp(max=s.blocks - 1)
    inner = n - b * s.block
    vals = _blocks_of(s, rows, b).clamp(min=0).double()
    cols = torch.arange(s.block, device=rows.device)
    part = torch.where(cols < inner.unsqueeze(1), vals, 0.0).sum(-1)
    return s.before[rows, b] + part


def _value_at(s: SortedRows, rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    return s.values.view(-1)[rows * s.values.shape[1] + pos]


def sample_shared(
    weights: torch.Tensor,
    rows: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    k: torch.Tensor | None = None,
    p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
    joint: bool = False,
) -> torch.Tensor:
    """One token per draw (int64): draw i from row ``rows[i]`` of ``weights``.

    ``weights`` (B, V): probabilities (need not be normalised); ``uniforms`` (N,);
    ``k`` / ``p`` / ``min_p`` (N,): each draw's filter, as from normalize_top_k/_p
    (``k == vocab``, ``p >= 1``: off). Kept set: top-k (ties kept), then top-p over the
    top-k mass (``joint``: over the row's mass), and ``weight >= min_p * max``. A row
    with no distribution (NaN, no positive weight) gives token 0.
    """
    s = sort_rows(weights)
    usable = torch.isfinite(s.before[:, -1]) & (s.before[:, -1] > 0)
    last = s.values[:, s.block - 1 :: s.block]
    ends = last.neg().contiguous()
    inclusive_ends = s.before[:, 1:].contiguous()
    vocab = s.vocab
    parts = []
    for start in range(0, rows.shape[0], DRAW_CHUNK):
        r = rows[start : start + DRAW_CHUNK]
        u = uniforms[start : start + DRAW_CHUNK]
        e = ends.index_select(0, r)
        cum_ends = inclusive_ends.index_select(0, r)
        total = s.before[r, -1]
        zero = torch.zeros(r.shape[0], dtype=torch.float32, device=r.device)
        threshold = zero
        base = total
        if k is not None:
            kk = k[start : start + DRAW_CHUNK]
            on = kk < vocab
            t_k = torch.where(on, _value_at(s, r, (kk - 1).clamp(0, vocab - 1)), zero)
            n_k = torch.where(on, _count_at_least(s, r, t_k, e), vocab)
            threshold = t_k
            if not joint:
                base = torch.where(on, _mass_of_first(s, r, n_k), total)
        if p is not None:
            pp = p[start : start + DRAW_CHUNK]
            # top_p <= 0 keeps the heaviest weight(s), as the threshold rule does.
            target = (pp.double() * base).clamp(min=1e-300)
            j = _search(
                s, r, target, cum_ends, lambda r_, b: _inclusive(s, r_, b), False
            )
            reached = (pp < 1) & (j < vocab)
            t_p = torch.where(reached, _value_at(s, r, j.clamp(max=vocab - 1)), zero)
            threshold = torch.maximum(threshold, t_p)
        if min_p is not None:
            mp = min_p[start : start + DRAW_CHUNK]
            threshold = torch.maximum(
                threshold, mp * _value_at(s, r, torch.zeros_like(r))
            )
        # Kept: the weights >= threshold that are positive (zero weights never drawn).
        floor = torch.where(threshold > 0, threshold, torch.finfo(torch.float32).tiny)
        n = _count_at_least(s, r, floor, e).clamp(1, vocab)
        mass = _mass_of_first(s, r, n)
        pos = _search(
            s, r, u.double() * mass, cum_ends, lambda r_, b: _inclusive(s, r_, b), True
        )
        pos = torch.minimum(pos, n - 1)
        tokens = s.ids[r, pos]
        parts.append(torch.where(usable[r] & (mass > 0), tokens, 0))
    if not parts:
        return torch.empty(0, dtype=torch.int64, device=weights.device)
    return torch.cat(parts)


__all__ = ["SortedRows", "sample_shared", "sort_rows"]
