"""Uniforms for the portable sampler: from a ``torch.Generator`` or from flashinfer's
``seed`` / ``offset``.

Why: flashinfer's sampling functions take either a generator or an explicit ``seed`` and
``offset`` (ints, or int64 tensors so that a CUDA graph can replay them with new values).
The portable kernels draw a few uniforms per row; this module makes them.

How: with a generator (or the device's default one), ``torch.rand``. With ``seed`` /
``offset``, a counter-based generator evaluated by tensor ops on the whole batch at once:
uniform ``(row, draw)`` is a hash of (seed, offset, row, draw). The hash is built from a
32-bit integer mixer (multiply-xorshift, a bijection on 32-bit values) in int64 lanes that
never overflow, so it gives the same bits on every device, needs no host sync, and the
same (seed, offset) gives the same samples. It is not flashinfer's Philox stream: equal
seeds do not reproduce flashinfer's tokens, only its contract (same inputs, same output;
a new offset, new samples). The generator is not touched when ``seed`` / ``offset`` are
given.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
# Multipliers of the mixer (Wellons' "lowbias32"), applied as two 16-bit halves.
_MUL1 = 0x7FEB352D
_MUL2 = 0x846CA68B
# Odd constant separating the hashed fields (2**32 / golden ratio).
_GOLDEN = 0x9E3779B9


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for 0 <= x < 2**32, in int64 without overflow."""
    low = x * (c & 0xFFFF)
    high = ((x * (c >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, _MUL1)
    x = x ^ (x >> 15)
    x = _mul32(x, _MUL2)
    return x ^ (x >> 16)


def _absorb(state: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return _mix32((state ^ (value & _MASK32)) + _GOLDEN & _MASK32)


def counter_uniforms(
    seed: torch.Tensor, offset: torch.Tensor, draws: int
) -> torch.Tensor:
    """(n, draws) float32 uniforms in [0, 1) from int64 (n,) ``seed`` and ``offset``."""
    n = seed.shape[0]
    device = seed.device
    row = torch.arange(n, dtype=torch.int64, device=device).unsqueeze(1)
    column = torch.arange(draws, dtype=torch.int64, device=device).unsqueeze(0)
    state = _mix32(seed.unsqueeze(1) & _MASK32)
    state = _absorb(state, seed.unsqueeze(1) >> 32)
    state = _absorb(state, offset.unsqueeze(1))
    state = _absorb(state, offset.unsqueeze(1) >> 32)
    state = _absorb(state, row)
    state = _absorb(state.expand(n, draws), column)
    # The top 24 bits: exactly representable in float32, strictly below 1.
    return (state >> 8).to(torch.float32) * (1.0 / (1 << 24))


def _as_int64(value: int) -> int:
    """A Python int (uint64 seeds included) as the int64 with the same 64 bits."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def seed_offset_tensors(
    seed: int | torch.Tensor | None,
    offset: int | torch.Tensor | None,
    batch: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """flashinfer's ``seed`` / ``offset`` as int64 (batch,) tensors, checked; None when
    neither is given (then the generator is used)."""
    if seed is None and offset is None:
        return None
    if seed is None or offset is None:
        raise ValueError(
            "seed and offset must be given together (the generator is used when both "
            f"are None); got seed={seed!r}, offset={offset!r}"
        )
    if isinstance(seed, torch.Tensor) != isinstance(offset, torch.Tensor):
        raise ValueError("seed and offset must both be tensors or both be scalars")
    out = []
    for name, value in (("seed", seed), ("offset", offset)):
        if isinstance(value, torch.Tensor):
            if value.device != device:
                raise ValueError(
                    f"{name} tensor must be on {device}, got {value.device}"
                )
            if value.dtype != torch.int64:
                raise ValueError(f"{name} tensor must be int64, got {value.dtype}")
            if value.dim() != 1:
                raise ValueError(f"{name} tensor must be 1D, got {value.dim()}D")
            if value.shape[0] not in (1, batch):
                raise ValueError(
                    f"{name} tensor length must be 1 or {batch}, got {value.shape[0]}"
                )
            out.append(value.expand(batch))
        else:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int or an int64 tensor")
            out.append(
                torch.full((batch,), _as_int64(value), dtype=torch.int64, device=device)
            )
    return out[0], out[1]


def uniforms(
    batch: int,
    draws: int,
    device: torch.device,
    *,
    generator: torch.Generator | None = None,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """(batch, draws) float32 uniforms in [0, 1): from ``seed``/``offset`` when given,
    else from ``generator`` (default: the device's)."""
    pair = seed_offset_tensors(seed, offset, batch, device)
    if pair is not None:
        return counter_uniforms(pair[0], pair[1], draws)
    return torch.rand((batch, draws), device=device, generator=generator)
