"""Portable W8A8 int8 linear: vLLM's int8 semantics in plain torch, on any device.

Why: every int8 kernel vLLM 0.15.1 ships needs ``vllm._C``, which does not load on
torch 2.5.1. On Kunlun the vendor kernels serve W8A8 layers (``ops/int8/seam.py``); this
module serves them everywhere else (host emulation, CI, a Kunlun host without the
vendor wheels) and is the reference the vendor path is tested against.

How (semantics of vLLM's CUDA kernels, ``csrc/quantization/w8a8/int8/scaled_quant.cu``
and the cutlass epilogues, not of compressed-tensors' reference; docs/quantization.md):

- dynamic symmetric, per token: ``scale = absmax / 127``, ``q = rne(x * (127 / absmax))``
  saturated to int8 (an all-zero row: scale 0, q 0). Everything in float32.
- dynamic asymmetric, per token: ``scale = (max - min) / 255``,
  ``azp = rne(-128 - min / scale)``, ``q = sat8(rne(x * (1 / scale)) + azp)``.
  A constant row, where vLLM divides by zero, gets its range widened to include 0
  (compressed-tensors' rule), so it dequantizes to itself.
- static, per tensor: ``q = sat8(rne(x / scale))``, or with a zero point
  ``sat8(rne(x * (1 / scale)) + azp)``.
- the product: int8 x int8 -> int32, exact. ``torch._int_mm`` where it applies and a
  one-time probe on this device finds it exact (torch 2.5.1's CPU ``_int_mm`` is NOT
  exact on CPUs without AVX512-VNNI: oneDNN saturates int16 intermediates,
  pytorch/pytorch#136746, fixed in 2.6); otherwise float32 matmuls over K-chunks of
  1024, whose partial sums are integers of at most 1024 x 128 x 128 = 2^24 and so
  exact, summed in int32; float64 if even that probe fails.
- the epilogue of vLLM's cutlass kernels: ``out = scale_a * (scale_b * acc) + bias`` in
  float32, then the output dtype; with a zero point ``acc - azp * azp_adj`` in int32
  first (``azp_adj`` = column sums of the weight, times the static zero point when
  the activation scale is per tensor).

The weight is kept as stored: ``[out, in]`` int8 with one float32 scale per output
channel (or one per tensor). Removal: when torch and vLLM ship an exact int8 GEMM that
loads on every device we serve.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vllm_kunlun.logger import init_logger

logger = init_logger(__name__)

I8_MIN, I8_MAX = -128, 127
CHUNK_K = 1024
"""The largest K whose int8 products sum exactly in float32: 1024 x 128 x 128 = 2^24."""


def _sat8(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(I8_MIN, I8_MAX).to(torch.int8)


def quantize_dynamic_symmetric(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [M, K] -> (int8 [M, K], float32 scale [M, 1]); vLLM's per-token rule."""
    xf = x.float()
    absmax = xf.abs().amax(dim=-1, keepdim=True)
    scale = absmax / 127.0
    inv = torch.where(absmax == 0, torch.zeros_like(absmax), 127.0 / absmax)
    return _sat8(torch.round(xf * inv)), scale


def quantize_dynamic_asymmetric(
    x: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` [M, K] -> (int8, float32 scale [M, 1], int32 zero point [M, 1])."""
    xf = x.float()
    lo = xf.amin(dim=-1, keepdim=True)
    hi = xf.amax(dim=-1, keepdim=True)
    flat = lo == hi  # vLLM divides by zero here; widen the range to include 0
    lo = torch.where(flat, lo.clamp(max=0.0), lo)
    hi = torch.where(flat, hi.clamp(min=0.0), hi)
    scale = (hi - lo) / 255.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)  # an all-zero row
    azp = torch.round(-128.0 - lo / scale)
    q = torch.round(xf * (1.0 / scale)) + azp
    return _sat8(q), scale, azp.to(torch.int32)


def quantize_static(
    x: torch.Tensor, scale: torch.Tensor, azp: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-tensor ``scale`` (and int32 zero point ``azp``): vLLM's static rule."""
    xf = x.float()
    s = scale.float().reshape(())
    if azp is None:
        return _sat8(torch.round(xf / s))
    return _sat8(torch.round(xf * (1.0 / s)) + azp.reshape(()).to(torch.float32))


# ---- the exact int8 product ---------------------------------------------------------


def _int_mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch._int_mm(a, w.t())


def _float_chunks(
    dtype: torch.dtype,
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        k = a.shape[1]
        if dtype == torch.float64 or k <= CHUNK_K:
            return torch.mm(a.to(dtype), w.to(dtype).t()).round().to(torch.int32)
        acc = torch.zeros(a.shape[0], w.shape[0], dtype=torch.int32, device=a.device)
        for k0 in range(0, k, CHUNK_K):
            part = torch.mm(
                a[:, k0 : k0 + CHUNK_K].to(dtype), w[:, k0 : k0 + CHUNK_K].to(dtype).t()
            )
            acc += part.to(torch.int32)
        return acc

    return mm


def _int_mm_applies(a: torch.Tensor, w: torch.Tensor) -> bool:
    """torch 2.5.1's shape rules for ``_int_mm``: none on the CPU; on CUDA M > 16 and
    K, N multiples of 8. Other devices: not known, not tried."""
    if a.device.type == "cpu":
        return True
    if a.device.type == "cuda":
        m, k = a.shape
        return m > 16 and k % 8 == 0 and w.shape[0] % 8 == 0
    return False


def _always(a: torch.Tensor, w: torch.Tensor) -> bool:
    return True


@dataclass(frozen=True)
class _Candidate:
    name: str
    mm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    applies: Callable[[torch.Tensor, torch.Tensor], bool]


CANDIDATES = (
    _Candidate("torch._int_mm", _int_mm, _int_mm_applies),
    _Candidate("float32 K-chunks", _float_chunks(torch.float32), _always),
    _Candidate("float64", _float_chunks(torch.float64), _always),
)


def probe_inputs(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-range int8 operands (-128 included, K > one chunk, M > 16, multiples of 8):
    the values that made torch 2.5.1's CPU ``_int_mm`` saturate, and sums past 2^24."""
    gen = torch.Generator().manual_seed(1234)
    a = torch.randint(I8_MIN, I8_MAX + 1, (24, 2 * CHUNK_K + 16), generator=gen)
    w = torch.randint(I8_MIN, I8_MAX + 1, (16, 2 * CHUNK_K + 16), generator=gen)
    a[0] = I8_MIN  # the largest possible sums: -128 x -128 over the whole row
    w[0] = I8_MIN
    return a.to(torch.int8).to(device), w.to(torch.int8).to(device)


def _exact_on(candidate: _Candidate, device: torch.device) -> tuple[bool, str]:
    a, w = probe_inputs(device)
    want = a.cpu().long() @ w.cpu().long().t()
    try:
        got = candidate.mm(a, w).cpu().long()
    except Exception as exc:  # not implemented for this device / dtype
        return (
            False,
            f"{candidate.name} failed on {device} ({type(exc).__name__}: {exc})",
        )
    if not torch.equal(got, want):
        wrong = int((got != want).sum())
        return False, (
            f"{candidate.name} is not exact on {device} ({wrong} of {want.numel()} "
            "probe sums wrong; torch 2.5.1's CPU _int_mm saturates without "
            "AVX512-VNNI, pytorch/pytorch#136746)"
        )
    return True, f"{candidate.name} is exact on {device}"


class ExactInt8Matmul:
    """The exact int8 product for one device: probes once, says once what it uses."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.usable: list[_Candidate] = []
        self.notes: list[str] = []
        for candidate in CANDIDATES:
            ok, why = _exact_on(candidate, device)
            self.notes.append(why)
            if ok:
                self.usable.append(candidate)
                if candidate.applies is _always:
                    break  # serves every shape: later candidates are never reached
        if not self.usable:
            raise RuntimeError(
                f"vllm-kunlun: no exact int8 matmul on {device}: "
                + "; ".join(self.notes)
                + ". W8A8 checkpoints cannot be served on this device by the portable "
                "kernels; on Kunlun install the vendor op libraries (kunlun_ops, "
                "xspeedgate_ops) of the validated combination."
            )
        logger.info(
            "vllm-kunlun: int8 matmul on %s: %s (%s)",
            device,
            " where it applies, else ".join(c.name for c in self.usable),
            "; ".join(self.notes),
        )

    def __call__(self, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``a`` [M, K] int8 times ``w`` [N, K] int8, transposed: int32 [M, N]."""
        for candidate in self.usable:
            if candidate.applies(a, w):
                return candidate.mm(a, w)
        raise AssertionError("the last candidate applies to every shape")

    def chosen(self, a: torch.Tensor, w: torch.Tensor) -> str:
        return next(c.name for c in self.usable if c.applies(a, w))


_matmuls: dict[torch.device, ExactInt8Matmul] = {}


def exact_int8_matmul(device: torch.device) -> ExactInt8Matmul:
    device = torch.device(device)
    if device not in _matmuls:
        _matmuls[device] = ExactInt8Matmul(device)
    return _matmuls[device]


def int8_mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Exact ``a @ w.T`` for int8 ``a`` [M, K] and ``w`` [N, K]: int32 [M, N]."""
    if a.dtype != torch.int8 or w.dtype != torch.int8:
        raise TypeError(f"int8_mm takes int8 operands, got {a.dtype} and {w.dtype}")
    if a.shape[1] != w.shape[1]:
        raise ValueError(f"int8_mm: K differs ({tuple(a.shape)} vs {tuple(w.shape)})")
    return exact_int8_matmul(a.device)(a, w)


# ---- the epilogue -------------------------------------------------------------------


def scaled_epilogue(
    acc: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    azp: torch.Tensor | None = None,
    azp_adj: torch.Tensor | None = None,
) -> torch.Tensor:
    """int32 ``acc`` [M, N] -> ``scale_a * (scale_b * (acc - azp * azp_adj)) + bias``.

    ``scale_a``: [M, 1] per token or one value; ``scale_b``: one per output channel
    (any shape with N elements) or one value; ``azp``: int32 [M, 1] per token (dynamic)
    or None with the zero point already folded into ``azp_adj`` [N] (static).
    """
    if azp_adj is not None:
        adj = azp_adj.reshape(1, -1).to(torch.int32)
        acc = acc - (adj if azp is None else azp.reshape(-1, 1).to(torch.int32) * adj)
    n = acc.shape[1]
    sb = (
        scale_b.float().reshape(1, n)
        if scale_b.numel() == n
        else scale_b.float().reshape(())
    )
    sa = (
        scale_a.float().reshape(-1, 1)
        if scale_a.numel() > 1
        else scale_a.float().reshape(())
    )
    out = acc.float() * sb * sa
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def int8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    input_scale: torch.Tensor | None = None,
    input_zero_point: torch.Tensor | None = None,
    azp_adj: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """A W8A8 linear layer, as vLLM's int8 kernels compute it.

    ``x`` [..., K] float; ``weight`` int8 [N, K]; ``weight_scale`` float32, one per
    output channel or one. Dynamic per-token activations when ``input_scale`` is None,
    else static per-tensor; asymmetric (azp) when ``azp_adj`` is given (dynamic) or
    ``input_zero_point`` is (static, ``azp_adj`` then holds zero point x column sums).
    """
    x2 = x.reshape(-1, x.shape[-1])
    azp = None
    if input_scale is None:
        if azp_adj is None:
            q, scale_a = quantize_dynamic_symmetric(x2)
        else:
            q, scale_a, azp = quantize_dynamic_asymmetric(x2)
    else:
        q = quantize_static(x2, input_scale, input_zero_point)
        scale_a = input_scale
    acc = int8_mm(q, weight)
    out = scaled_epilogue(acc, scale_a, weight_scale, x.dtype, bias, azp, azp_adj)
    return out.reshape(*x.shape[:-1], weight.shape[0])
