"""SiLU-and-mul (SwiGLU's gate) on the vendor kernel.

Why: every MLP of a Qwen/Llama-style model computes ``silu(x[..., :d]) * x[..., d:]``
on the gate_up projection; vLLM's native path is three torch kernels and a temporary,
the vendor library does it in one. ``ops/custom_ops/activation_vendor.py`` calls this wrapper
and falls back to vLLM's native path when it raises ``Refused``.

Assumes ``kunlun_ops.silu_and_mul(x, axis=-1, turn=True, out=out)`` (upstream's form)
computes vLLM's order, SiLU on the first half: ``turn=True`` is what upstream passes for
vLLM's ``SiluAndMul``. ``x`` is made contiguous; ``out`` is a fresh ``[..., d]`` tensor.

Removal: never; this is the vendor seam for the activation.
"""

from __future__ import annotations

import torch

from vllm_kunlun.ops.routes import FLOAT_DTYPES, Kernels, Refused


def silu_and_mul(k: Kernels, x: torch.Tensor) -> torch.Tensor:
    width = x.shape[-1]
    if width % 2:
        raise Refused(f"odd last dimension {width}")
    if x.dtype not in FLOAT_DTYPES:
        raise Refused(f"input dtype {x.dtype} is not a kernel dtype")
    out = torch.empty((*x.shape[:-1], width // 2), dtype=x.dtype, device=x.device)
    k["silu_and_mul"](x.contiguous(), axis=-1, turn=True, out=out)
    return out
