"""Fake of Kunlun's ``kunlun_ops``: flashinfer's sampling API, recording every call.

The compute kernels (attention, norms, rotary, activation) live in submodules, one per
family, re-exported below; see ``_kernel_common.py`` for their records and checks.

The real library (0.1.58) exposes flashinfer's sampling functions with flashinfer's
names and keyword arguments. This fake has the same signatures, checks its inputs the
way the real kernels require (float32 contiguous 2-D probs, int32 ``top_k`` and float32
``top_p`` tensors of one value per output row, all on the probs' device) and samples
with flashinfer's documented semantics, so a test can tell a real draw from a greedy
one: output row ``i`` is drawn from score row ``indices[i]`` (row ``i`` without
``indices``) with that output row's ``top_k`` / ``top_p``; top-k keeps the tokens at or
above the k-th largest probability (``k <= 0`` or ``>= vocab``: no top-k), top-p the
smallest descending prefix whose mass reaches ``p`` (``p >= 1``: no top-p), ties at a
threshold kept; ``filter_apply_order="top_k_first"`` takes top-p over the renormalised
top-k set, ``"joint"`` over the whole distribution; the kept set is renormalised and
one token drawn with ``generator`` (the global RNG when None). Tokens are int32, or
``indices``' dtype. A row with NaN, a negative weight or no mass raises (the real kernel
would return garbage; a test should hear about it).

Each call is kept in ``CALLS`` (a ``Call``: clones of the tensor arguments up to
``CLONE_LIMIT`` elements, larger ones as ``meta`` tensors of the same shape and dtype,
the output) and, when
``FAKE_KUNLUN_OPS_RECORD`` names a file, appended to it as one JSON line with the
output tokens and the values of the per-row parameters (engine processes a test did not
start leave their draws there too).
"""

from __future__ import annotations

import os as _os
from dataclasses import dataclass
from typing import Any

import torch

from kunlun_ops import _kernel_common as _common
from kunlun_ops._activation import *  # noqa: F403
from kunlun_ops._attention import *  # noqa: F403
from kunlun_ops._norms import *  # noqa: F403
from kunlun_ops._rotary import *  # noqa: F403

__version__ = "0.1.58"

_ORDERS = ("top_k_first", "joint")


@dataclass
class Call:
    name: str
    tensors: dict[str, torch.Tensor]  # clones (meta beyond CLONE_LIMIT elements)
    contiguous: dict[str, bool]
    scalars: dict[str, Any]
    out: torch.Tensor | None = None  # what the kernel returned


CALLS: list[Any] = []
# A state pool or KV cache is passed whole on every call: cloning it into every record
# grew an engine process by gigabytes in seconds. What tests read (parameters, indices,
# a batch's probabilities) is far smaller.
CLONE_LIMIT = 1 << 18


def _kept(v: torch.Tensor) -> torch.Tensor:
    v = v.detach()
    return v.clone() if v.numel() <= CLONE_LIMIT else v.to("meta")


def reset() -> None:
    CALLS.clear()


def _record(name: str, **kwargs: Any) -> Call:
    tensors = {k: _kept(v) for k, v in kwargs.items() if torch.is_tensor(v)}
    contiguous = {k: v.is_contiguous() for k, v in kwargs.items() if torch.is_tensor(v)}
    scalars = {k: v for k, v in kwargs.items() if not torch.is_tensor(v)}
    call = Call(name, tensors, contiguous, scalars)
    CALLS.append(call)
    return call


def _record_draw(name: str, out: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """Record a sampling call with its output, here and in the record file."""
    _record(name, **kwargs).out = out.clone()
    args = {k: _common.describe(v) for k, v in kwargs.items()}
    for k, v in kwargs.items():
        if torch.is_tensor(v) and v.dim() == 1:  # per-row parameters, indices
            args[k]["values"] = v.tolist()
    _common.write_record(
        {"name": name, "args": args, "pid": _os.getpid(), "out": out.tolist()}
    )
    return out


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


def _rows(scores: torch.Tensor, indices: Any) -> tuple[torch.Tensor, int]:
    """The score row of each output row, and the output row count."""
    if indices is None:
        return torch.arange(scores.shape[0], device=scores.device), scores.shape[0]
    if (
        not isinstance(indices, torch.Tensor)
        or indices.dim() != 1
        or indices.dtype not in (torch.int32, torch.int64)
        or indices.device != scores.device
    ):
        raise ValueError(
            f"indices must be a 1-D int32/int64 tensor on {scores.device}, got "
            f"{indices!r:.80}"
        )
    if indices.numel() and (
        int(indices.min()) < 0 or int(indices.max()) >= scores.shape[0]
    ):
        raise ValueError(f"indices outside the {scores.shape[0]} rows of the scores")
    return indices.long(), indices.shape[0]


def _per_row(x: Any, batch: int, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.to(dtype)
    return torch.full((batch,), x, dtype=dtype)


def _weights(probs: torch.Tensor, top_k: Any, top_p: Any, order: str) -> torch.Tensor:
    """float64 weights of the kept tokens (zero elsewhere), each row summing to 1."""
    batch, vocab = probs.shape
    k = _per_row(top_k, batch, torch.int64).to(probs.device)
    p = _per_row(top_p, batch, torch.float64).to(probs.device)
    desc = probs.sort(dim=-1, descending=True).values
    use_k = (k > 0) & (k < vocab)
    floor = desc.gather(1, (k.clamp(1, vocab) - 1).unsqueeze(1))
    floor = torch.where(use_k.unsqueeze(1), floor, torch.zeros_like(floor))
    keep = probs >= floor
    kept_desc = torch.where(desc >= floor, desc, torch.zeros_like(desc))
    mass = desc.sum(-1) if order == "joint" else kept_desc.sum(-1)
    cut = torch.searchsorted(kept_desc.cumsum(-1), (p * mass).unsqueeze(1))
    threshold = desc.gather(1, cut.clamp(max=vocab - 1))
    keep &= (probs >= threshold) | (p >= 1).unsqueeze(1)
    w = torch.where(keep, probs, torch.zeros_like(probs))
    return w / w.sum(-1, keepdim=True)


def _sample(
    scores: torch.Tensor,
    what: str,
    top_k: Any,
    top_p: Any,
    indices: Any,
    order: str,
    generator: Any,
    check_nan: bool,
) -> torch.Tensor:
    _check_matrix(scores, what)
    if order not in _ORDERS:
        raise ValueError(f"filter_apply_order must be one of {_ORDERS}, got {order!r}")
    rows, batch = _rows(scores, indices)
    if top_k is not None:
        _check_param(top_k, batch, torch.int32, scores, "top_k")
    if top_p is not None:
        _check_param(top_p, batch, torch.float32, scores, "top_p")
    x = scores.double()
    if bool(torch.isnan(x).any()):
        raise ValueError(f"Input {what} contains NaN.")
    if what == "logits":
        x = x.softmax(dim=-1)
    elif bool((x < 0).any()):
        raise ValueError("probs has negative entries")
    total = x.sum(-1, keepdim=True)
    if bool((total <= 0).any() or not torch.isfinite(total).all()):
        raise ValueError(f"a row of {what} has no probability mass")
    probs = (x / total)[rows]
    w = _weights(
        probs, 0 if top_k is None else top_k, 1.0 if top_p is None else top_p, order
    )
    out_dtype = indices.dtype if isinstance(indices, torch.Tensor) else torch.int32
    if batch == 0:
        return torch.empty(0, dtype=out_dtype, device=scores.device)
    return torch.multinomial(w, 1, generator=generator).view(-1).to(out_dtype)


def sampling_from_probs(
    probs, indices=None, deterministic=True, generator=None, check_nan=False
):
    out = _sample(
        probs, "probs", None, None, indices, "top_k_first", generator, check_nan
    )
    return _record_draw(
        "sampling_from_probs",
        out,
        probs=probs,
        indices=indices,
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
    )


def top_p_sampling_from_probs(
    probs, top_p, indices=None, deterministic=True, generator=None, check_nan=False
):
    out = _sample(
        probs, "probs", None, top_p, indices, "top_k_first", generator, check_nan
    )
    return _record_draw(
        "top_p_sampling_from_probs",
        out,
        probs=probs,
        top_p=top_p,
        indices=indices,
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
    )


def top_k_sampling_from_probs(
    probs, top_k, indices=None, deterministic=True, generator=None, check_nan=False
):
    out = _sample(
        probs, "probs", top_k, None, indices, "top_k_first", generator, check_nan
    )
    return _record_draw(
        "top_k_sampling_from_probs",
        out,
        probs=probs,
        top_k=top_k,
        indices=indices,
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
    )


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
    out = _sample(
        probs, "probs", top_k, top_p, indices, filter_apply_order, generator, check_nan
    )
    return _record_draw(
        "top_k_top_p_sampling_from_probs",
        out,
        probs=probs,
        top_k=top_k,
        top_p=top_p,
        indices=indices,
        filter_apply_order=filter_apply_order,
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
    )


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
    out = _sample(
        logits,
        "logits",
        top_k,
        top_p,
        indices,
        filter_apply_order,
        generator,
        check_nan,
    )
    return _record_draw(
        "top_k_top_p_sampling_from_logits",
        out,
        logits=logits,
        top_k=top_k,
        top_p=top_p,
        indices=indices,
        filter_apply_order=filter_apply_order,
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
    )


from kunlun_ops._gdn import *  # noqa: E402,F403  (Gated DeltaNet kernels)
from kunlun_ops._int8 import matmul, quant2d  # noqa: E402,F401  (W8A8 int8 kernels)
from kunlun_ops._mla import (  # noqa: E402,F401  (MLA cache write and decode)
    concat_and_cache_mla,
    fwd_kvcache_mla,
)
from kunlun_ops._moe import moe_ffn_block  # noqa: E402,F401  (the routed MoE block)
from kunlun_ops._moe_routing import (  # noqa: E402,F401  (MoE routing kernels)
    moe_sigmoid_group_topk_norm,
    moe_softmax_topk_norm,
)
