"""The plugin's C++ CPU sampler: ``torch.ops.vllm_kunlun.sample_rows`` (csrc/).

Why: on the CPU the portable torch sampler issues 30-60 tensor operations per step and
reads the logits 6-12 times; a decode step is memory-bound, so one read of the logits is
the floor. The native kernel reads each row about once (block maxima, then a rejection
draw; a second pass only for top-p without top-k) with the portable sampler's kept sets
(top-k then top-p, ties kept) and contract (one token per row from its uniforms; a row
without a distribution yields token 0). csrc/sampling_cpu.cpp has the algorithm.

It serves logits on the CPU (host emulation, CI, CPU serving); devices keep the vendor
kernel or the portable torch kernels, and flashinfer's API (``flashinfer_api``) stays
torch. Without the extension (``VLLM_KUNLUN_BUILD_EXT=0``) the portable kernels run.
"""

from __future__ import annotations

import functools

import torch

from vllm_kunlun.ops import native
from vllm_kunlun.ops.sampling import draw as draw_ops
from vllm_kunlun.ops.sampling import threshold

OP_NAME = "sample_rows"
# Rejection tries per draw before the exact inverse transform (each try succeeds with
# probability >= 1/64, so the fallback practically never runs); tests pass 0 to force it.
MAX_TRIES = 1 << 12
# Top-p redraws after a rejected token before the exact threshold (tests pass 0).
ROUNDS = 2


@functools.cache
def _loaded() -> tuple[bool, str]:
    return native.has_op(OP_NAME)


def available() -> tuple[bool, str]:
    """(True, what) when the native sampler is loaded (loading it once), else (False,
    why and the fix)."""
    ok, what = _loaded()
    if ok:
        what = f"{what} ({isa()} kernels)"
    return ok, what


def preferred() -> tuple[bool, str]:
    """``available()``, but False also where only the portable C++ kernels run (no
    AVX2): those are slower than the portable torch sampler (top-p about 2x), so
    ``VLLM_KUNLUN_SAMPLER=auto`` does not choose them."""
    ok, what = available()
    if ok and isa() == "scalar":
        return False, (
            f"{what}, but this CPU has no AVX2/FMA: the portable torch kernels are "
            "faster there (VLLM_KUNLUN_SAMPLER=native forces the C++ ones)"
        )
    return ok, what


def isa(force: str | None = None) -> str:
    """The row kernels' instruction set: ``"avx2"`` or ``"scalar"`` (portable C++, what
    CPUs without AVX2 run). ``force="scalar"`` switches this process to the portable
    kernels (tests and benchmarks of the fallback on any CPU), ``"auto"`` back."""
    _require()
    return str(torch.ops.vllm_kunlun.sample_rows_isa(force))


def _require() -> None:
    ok, why = _loaded()
    if not ok:
        raise RuntimeError(f"the native sampler is not available: {why}")


def sample(
    logits: torch.Tensor,
    top_k: torch.Tensor | int | None,
    top_p: torch.Tensor | float | None,
    uniforms: torch.Tensor,
    *,
    max_tries: int = MAX_TRIES,
    rounds: int = ROUNDS,
) -> torch.Tensor:
    """One token per row of CPU ``logits`` (B, V) (int64), the portable ``sample``'s
    contract for logits: ``top_k`` / ``top_p`` a number or one value per row (a single
    value broadcasts, as in vLLM), ``uniforms`` (B,) or (B, D) in [0, 1): a row's token
    depends only on its logits, its filters and its uniforms. ``logits`` is not written.
    """
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(
            f"logits must be 2-D (batch, vocab) with a vocabulary; got shape "
            f"{tuple(logits.shape)}"
        )
    if logits.device.type != "cpu":
        raise ValueError(
            f"the native sampler runs on the CPU; the logits are on {logits.device} "
            "(sampling.portable.sample serves any device)"
        )
    batch, vocab = logits.shape
    u = draw_ops.uniform_rows(uniforms, batch)
    if batch == 0:
        return torch.empty(0, dtype=torch.int64)
    _require()
    k = threshold.normalize_top_k(top_k, batch, vocab, logits.device)
    p = threshold.normalize_top_p(top_p, batch, logits.device)
    scores = logits.float()
    if scores.stride(1) != 1:
        scores = scores.contiguous()  # rows may repeat or be slices, not be strided
    return torch.ops.vllm_kunlun.sample_rows(
        scores,
        None if k is None else k.contiguous(),
        None if p is None else p.contiguous(),
        u.to(torch.float32).contiguous(),
        max_tries,
        rounds,
    )
