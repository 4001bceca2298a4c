"""Fake ``silu_and_mul``: ``out = silu(x[..., :d]) * x[..., d:]`` (``turn=True``, the
order upstream asks for vLLM's SiluAndMul), in float32, written into ``out``."""

from __future__ import annotations

import torch.nn.functional as F

from kunlun_ops._kernel_common import (
    FLOATS,
    check_same,
    check_tensor,
    fail,
    record,
    unmodeled,
)

__all__ = ["silu_and_mul"]


def silu_and_mul(x, /, *, axis=-1, turn=True, out):
    name = "silu_and_mul"
    record(name, x=x, axis=axis, turn=turn, out=out)
    unmodeled(name, axis=(axis, -1), turn=(turn, True))
    check_tensor(name, "x", x, dtypes=FLOATS)
    check_same(name, "x", x, out=out)
    d = x.shape[-1] // 2
    if x.shape[-1] % 2 or out.shape != (*x.shape[:-1], d):
        fail(name, f"out {tuple(out.shape)} for x {tuple(x.shape)}")
    out.copy_(F.silu(x[..., :d].float()) * x[..., d:].float())
