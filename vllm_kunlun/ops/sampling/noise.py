"""Random numbers for sampling without ``Tensor.exponential_``.

Why: on Kunlun ``exponential_`` silently runs on the CPU (no device kernel), while
``uniform_`` has one (0.01 s for 256 x 152K). Exp(1) noise is therefore drawn as
``-log(U)``. Rows with their own ``torch.Generator`` (seeded requests) draw with it, one
call per row; all other rows share one batched draw. Every row is transformed exactly
once, after all draws, so a mixed batch of seeded and unseeded rows keeps each row's
noise Exp(1).
"""

from __future__ import annotations

from collections.abc import Container, Mapping

import torch

# uniform_ draws from [0, 1): U = 0 would make -log(U) infinite. Clamping U to the
# smallest normal float32 caps the noise at 87.3 instead (an Exp(1) tail of 1e-38).
_TINY = torch.finfo(torch.float32).tiny


def row_uniforms(
    batch: int,
    generators: Mapping[int, torch.Generator],
    device: torch.device,
    draws: int = 1,
) -> torch.Tensor:
    """(batch, draws) U[0, 1) float32: seeded rows from their own generator.

    A seeded row's values depend only on its generator, never on its batch position or
    the other rows. The batched draw is skipped when every row is seeded (as vLLM does),
    so the global RNG is not consumed then. A ``torch.Generator`` cannot be advanced as
    part of a batch, so each seeded row costs one small draw (vLLM's native sampler
    does the same); everything after the uniforms is batched.
    """
    u = torch.empty((batch, draws), dtype=torch.float32, device=device)
    if len(generators) != batch:
        u.uniform_()
    for i, generator in generators.items():
        u[i].uniform_(generator=generator)
    return u


def exponential_noise(
    rows: int,
    cols: int,
    generators: Mapping[int, torch.Generator],
    device: torch.device,
    seeded_rows: Container[int] | None = None,
) -> torch.Tensor:
    """(rows, cols) float32 Exp(1) noise, finite and > 0, without ``exponential_``.

    ``seeded_rows``: the generator rows that draw with their generator (default: all
    of ``generators``); the others keep the batched draw, as vLLM's rejection sampler
    does for requests without draft tokens.
    """
    q = torch.empty((rows, cols), dtype=torch.float32, device=device)
    drawn = [i for i in generators if seeded_rows is None or i in seeded_rows]
    if len(drawn) != rows:
        q.uniform_()
    for i in drawn:
        q[i].uniform_(generator=generators[i])
    # One transform for every row, after all draws.
    return q.clamp_(min=_TINY).log_().neg_()
