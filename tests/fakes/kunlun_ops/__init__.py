"""Fake of Kunlun's ``kunlun_ops``: flashinfer's sampling API, recording every call.

The compute kernels (attention, norms, rotary, activation) live in submodules, one per
family, re-exported below; see ``_kernel_common.py`` for their records and checks.

The real library (0.1.58) exposes flashinfer's sampling functions with flashinfer's
names and keyword arguments. This fake has the same signatures, checks its inputs the
way the real kernels require (float32 contiguous 2-D probs, int32 ``top_k`` and float32
``top_p`` tensors of one value per row, all on the probs' device), records each call in
``CALLS`` and returns the most likely token of each row as int32 (a deterministic
stand-in for a draw), so a test can tell the kernel's output reached the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kunlun_ops._activation import *  # noqa: F403
from kunlun_ops._attention import *  # noqa: F403
from kunlun_ops._norms import *  # noqa: F403
from kunlun_ops._rotary import *  # noqa: F403

__version__ = "0.1.58"


@dataclass
class Call:
    name: str
    tensors: dict[str, torch.Tensor]  # clones of the tensor arguments
    contiguous: dict[str, bool]
    scalars: dict[str, Any]


CALLS: list[Call] = []


def reset() -> None:
    CALLS.clear()


def _record(name: str, **kwargs: Any) -> None:
    tensors = {k: v.detach().clone() for k, v in kwargs.items() if torch.is_tensor(v)}
    contiguous = {k: v.is_contiguous() for k, v in kwargs.items() if torch.is_tensor(v)}
    scalars = {k: v for k, v in kwargs.items() if not torch.is_tensor(v)}
    CALLS.append(Call(name, tensors, contiguous, scalars))


def _check_matrix(x: torch.Tensor, what: str) -> None:
    if x.dim() != 2 or x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError(
            f"{what} must be a contiguous 2-D float32 tensor, got {x.dtype} "
            f"{tuple(x.shape)} contiguous={x.is_contiguous()}"
        )


def _check_param(x: Any, batch: int, dtype: torch.dtype, ref: torch.Tensor, what: str):
    if isinstance(x, torch.Tensor):
        if x.dtype != dtype or x.shape != (batch,) or x.device != ref.device:
            raise ValueError(
                f"{what} must be a ({batch},) {dtype} tensor on {ref.device}, got "
                f"{x.dtype} {tuple(x.shape)} on {x.device}"
            )
    elif not isinstance(x, (int, float)):
        raise TypeError(f"{what} must be a tensor or a number, got {type(x).__name__}")


def _mode(x: torch.Tensor, indices: torch.Tensor | None) -> torch.Tensor:
    if indices is not None:
        x = x[indices.long()]
    return x.argmax(dim=-1).to(torch.int32)


def sampling_from_probs(
    probs, indices=None, deterministic=True, generator=None, check_nan=False
):
    _check_matrix(probs, "probs")
    _record(
        "sampling_from_probs",
        probs=probs,
        indices=indices,
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
    )
    return _mode(probs, indices)


def top_p_sampling_from_probs(
    probs, top_p, indices=None, deterministic=True, generator=None, check_nan=False
):
    _check_matrix(probs, "probs")
    _check_param(top_p, probs.shape[0], torch.float32, probs, "top_p")
    _record(
        "top_p_sampling_from_probs",
        probs=probs,
        top_p=top_p,
        indices=indices,
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
    )
    return _mode(probs, indices)


def top_k_sampling_from_probs(
    probs, top_k, indices=None, deterministic=True, generator=None, check_nan=False
):
    _check_matrix(probs, "probs")
    _check_param(top_k, probs.shape[0], torch.int32, probs, "top_k")
    _record(
        "top_k_sampling_from_probs",
        probs=probs,
        top_k=top_k,
        indices=indices,
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
    )
    return _mode(probs, indices)


def top_k_top_p_sampling_from_probs(
    probs,
    top_k,
    top_p,
    indices=None,
    filter_apply_order="top_k_first",
    deterministic=True,
    generator=None,
    check_nan=False,
):
    _check_matrix(probs, "probs")
    _check_param(top_k, probs.shape[0], torch.int32, probs, "top_k")
    _check_param(top_p, probs.shape[0], torch.float32, probs, "top_p")
    _record(
        "top_k_top_p_sampling_from_probs",
        probs=probs,
        top_k=top_k,
        top_p=top_p,
        indices=indices,
        filter_apply_order=filter_apply_order,
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
    )
    return _mode(probs, indices)


def top_k_top_p_sampling_from_logits(
    logits,
    top_k,
    top_p,
    indices=None,
    filter_apply_order="top_k_first",
    deterministic=True,
    generator=None,
    check_nan=False,
):
    _check_matrix(logits, "logits")
    _check_param(top_k, logits.shape[0], torch.int32, logits, "top_k")
    _check_param(top_p, logits.shape[0], torch.float32, logits, "top_p")
    _record(
        "top_k_top_p_sampling_from_logits",
        logits=logits,
        top_k=top_k,
        top_p=top_p,
        indices=indices,
        filter_apply_order=filter_apply_order,
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
    )
    return _mode(logits, indices)


from kunlun_ops._gdn import *  # noqa: E402,F403  (Gated DeltaNet kernels)
from kunlun_ops._int8 import matmul, quant2d  # noqa: E402,F401  (W8A8 int8 kernels)
