"""Fake of Kunlun's ``xspeedgate_ops``: importing it registers its kernels as torch
custom ops under ``torch.ops.xspeedgate_ops``, as the real library does."""

from __future__ import annotations

__version__ = "vendor-build-fake"

from xspeedgate_ops import (
    _gptq,  # noqa: F401  (weight-only GPTQ GEMM)
    _lora,  # noqa: F401  (LoRA bgmv kernels)
)
from xspeedgate_ops._int8 import CALLS, reset  # noqa: F401  (W8A8 int8 kernels)
