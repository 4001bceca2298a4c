"""flashinfer's ``flashinfer.sampling`` API (0.6.1) in portable torch, for kernel developers.

Why: the vendor op library ships flashinfer's sampling functions; a kernel developer
needs the same functions, with the same arguments, dtypes and errors, on any device, to
test a kernel against or to run where the vendor library is missing. The plugin's
sampler does not run on this module (it calls ``portable.py`` directly); this module is
the public, documented surface, with flashinfer's argument checks on top of the
portable sampler.

Semantics are ``portable.py``'s (top-k first or ``filter_apply_order="joint"``, ties at
a threshold kept, a row without a distribution yields token 0), plus flashinfer's own:
``indices`` (many draws per score row), a ``generator`` or an explicit ``seed`` /
``offset`` (``rng.py``), ``check_nan=True`` (raises on NaN, which synchronises), and
``deterministic`` accepted and ignored (the result depends only on the inputs and the
uniforms). The seven ``*sampling_from_*`` functions differ only in their input and
filter parameters, so one factory builds them from a table of signature parts
(``inspect.signature`` and the docstrings are flashinfer's).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from vllm_kunlun.ops.sampling import draw as draw_ops
from vllm_kunlun.ops.sampling import rng
from vllm_kunlun.ops.sampling import shared_rows as shared
from vllm_kunlun.ops.sampling.portable import (
    DRAWS,
    as_float_matrix,
    filter_scores,
    sample,
)
from vllm_kunlun.ops.sampling.threshold import (
    normalize_top_k,
    normalize_top_p,
    probabilities,
)

__all__ = [
    "chain_speculative_sampling",
    "min_p_sampling_from_probs",
    "sampling_from_logits",
    "sampling_from_probs",
    "softmax",
    "top_k_mask_logits",
    "top_k_renorm_prob",
    "top_k_renorm_probs",
    "top_k_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
    "top_p_renorm_prob",
    "top_p_renorm_probs",
    "top_p_sampling_from_probs",
]

_FILTER_ORDERS = ("top_k_first", "joint")
_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
_EMPTY = inspect.Parameter.empty


def _check_indices(
    indices: torch.Tensor | None, device: torch.device
) -> torch.Tensor | None:
    if indices is None:
        return None
    if not isinstance(indices, torch.Tensor) or indices.dim() != 1:
        raise ValueError("indices must be a 1D tensor of shape (batch_size,)")
    if indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"indices must be int32 or int64, got {indices.dtype}")
    return indices.to(device=device, dtype=torch.int64)


def _check_nan(x: torch.Tensor, what: str) -> None:
    if bool(torch.isnan(x).any()):  # opt-in: synchronises
        raise ValueError(f"Input {what} contains NaN.")


def _draw_rows(
    scores: torch.Tensor, what: str, indices: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, int, torch.dtype]:
    """The checked score matrix, the score row of each draw (None: one draw per row),
    the number of draws and the output dtype (int32, or ``indices``' dtype)."""
    scores = as_float_matrix(scores, what)
    out_dtype = indices.dtype if isinstance(indices, torch.Tensor) else torch.int32
    rows = _check_indices(indices, scores.device)
    draws = scores.shape[0] if rows is None else rows.shape[0]
    return scores, rows, draws, out_dtype


def _sample_api(
    scores: torch.Tensor,
    what: str,
    *,
    indices: torch.Tensor | None,
    generator: torch.Generator | None,
    check_nan: bool,
    seed: int | torch.Tensor | None,
    offset: int | torch.Tensor | None,
    top_k: torch.Tensor | int | None = None,
    top_p: torch.Tensor | float | None = None,
    filter_apply_order: str = "top_k_first",
) -> torch.Tensor:
    """flashinfer's sampling contract: one token per row of ``scores`` (or per entry of
    ``indices``), dtype int32 (or ``indices``' dtype), inputs untouched."""
    if filter_apply_order not in _FILTER_ORDERS:
        raise ValueError(
            f"Invalid filter_apply_order: {filter_apply_order!r}; use one of "
            f"{_FILTER_ORDERS}"
        )
    scores, rows, draws, out_dtype = _draw_rows(scores, what, indices)
    batch, vocab = scores.shape
    if draws == 0:
        return torch.empty(0, dtype=out_dtype, device=scores.device)
    # flashinfer's rule: a parameter is a scalar or one value per output row.
    k = normalize_top_k(top_k, draws, vocab, scores.device, strict=True)
    p = normalize_top_p(top_p, draws, scores.device, strict=True)
    if check_nan:
        _check_nan(scores, what)
    u = rng.uniforms(
        draws, DRAWS, scores.device, generator=generator, seed=seed, offset=offset
    )
    logits = what == "logits"
    joint = filter_apply_order == "joint"
    per_draw = isinstance(top_k, torch.Tensor) or isinstance(top_p, torch.Tensor)
    if rows is None:
        tokens = sample(scores, k, p, u, scores_are_logits=logits, joint=joint)
    elif not per_draw:
        # One filter for every draw: plan each score row once, draw per index.
        k_row = None if k is None else k[:1].expand(batch)
        p_row = None if p is None else p[:1].expand(batch)
        tokens = sample(
            scores, k_row, p_row, u, scores_are_logits=logits, joint=joint, rows=rows
        )
    else:
        # Each draw has its own filter: sort every row once, search per draw (no copy
        # of a row per draw).
        weights = probabilities(scores, scores_are_logits=logits)
        tokens = shared.sample_shared(weights, rows, u[:, 0], k=k, p=p, joint=joint)
    return tokens.to(out_dtype)


def _min_p_api(
    probs: torch.Tensor,
    what: str,
    *,
    min_p: torch.Tensor | float,
    indices: torch.Tensor | None,
    generator: torch.Generator | None,
    check_nan: bool,
    seed: int | torch.Tensor | None,
    offset: int | torch.Tensor | None,
) -> torch.Tensor:
    """``min_p_sampling_from_probs``' body: keeps ``probs >= min_p * max``."""
    probs, rows, draws, out_dtype = _draw_rows(probs, what, indices)
    scale = normalize_top_p(min_p, draws, probs.device, strict=True)
    assert scale is not None
    if check_nan:
        _check_nan(probs, what)
    u = rng.uniforms(
        draws, 1, probs.device, generator=generator, seed=seed, offset=offset
    )
    if draws == 0:
        return torch.empty(0, dtype=out_dtype, device=probs.device)
    if rows is not None and isinstance(min_p, torch.Tensor):
        # One threshold per draw: sorted rows, searched per draw (no copy per draw).
        tokens = shared.sample_shared(probs, rows, u[:, 0], min_p=scale)
        return tokens.to(out_dtype)
    if rows is not None:
        scale = scale[:1].expand(probs.shape[0])
    threshold = scale * probs.amax(dim=-1)
    tokens = draw_ops.draw_with_mass(probs, u[:, 0], threshold=threshold, rows=rows)[0]
    return tokens.to(out_dtype)


# The sampling functions differ only in their input (probs or logits) and filter
# parameters; their signatures are built from these parts, in flashinfer's order
# (input, filters, indices, [filter_apply_order], the draw options). Annotations are
# strings, as ``from __future__ import annotations`` leaves them on a ``def``.
def _param(name: str, annotation: str, default: object = _EMPTY) -> inspect.Parameter:
    return inspect.Parameter(name, _POSITIONAL, default=default, annotation=annotation)


_FILTER_PARAMS = {
    "top_k": _param("top_k", "torch.Tensor | int"),
    "top_p": _param("top_p", "torch.Tensor | float"),
    "min_p": _param("min_p", "torch.Tensor | float"),
}
_INDICES = _param("indices", "torch.Tensor | None", None)
_ORDER = _param("filter_apply_order", "str", "top_k_first")
_DRAW_OPTIONS = (
    _param("deterministic", "bool", True),
    _param("generator", "torch.Generator | None", None),
    _param("check_nan", "bool", False),
    _param("seed", "int | torch.Tensor | None", None),
    _param("offset", "int | torch.Tensor | None", None),
)


def _sampling_function(
    name: str,
    what: str,
    filters: tuple[str, ...],
    doc: str,
    body: Callable[..., torch.Tensor] = _sample_api,
) -> Callable[..., torch.Tensor]:
    """One of flashinfer's ``*sampling_from_*`` functions: flashinfer's signature
    (``inspect.signature`` shows it), bound per call and handed to ``body``;
    ``deterministic`` is accepted and ignored."""
    params = [_param(what, "torch.Tensor")]
    params += [_FILTER_PARAMS[f] for f in filters]
    params.append(_INDICES)
    if filters == ("top_k", "top_p"):
        params.append(_ORDER)
    params += _DRAW_OPTIONS
    signature = inspect.Signature(params, return_annotation="torch.Tensor")

    def function(*args: Any, **kwargs: Any) -> torch.Tensor:
        arguments = signature.bind(*args, **kwargs)
        arguments.apply_defaults()
        given = dict(arguments.arguments)
        del given["deterministic"]
        return body(given.pop(what), what, **given)

    function.__name__ = function.__qualname__ = name
    function.__doc__ = doc
    function.__signature__ = signature  # type: ignore[attr-defined]
    function.__annotations__ = {p.name: p.annotation for p in params}
    function.__annotations__["return"] = "torch.Tensor"
    return function


sampling_from_probs = _sampling_function(
    "sampling_from_probs",
    "probs",
    (),
    "flashinfer's ``sampling_from_probs``: one token per row (or per index).",
)
sampling_from_logits = _sampling_function(
    "sampling_from_logits",
    "logits",
    (),
    "flashinfer's ``sampling_from_logits``: sampling from ``softmax(logits)``.",
)
top_p_sampling_from_probs = _sampling_function(
    "top_p_sampling_from_probs",
    "probs",
    ("top_p",),
    "flashinfer's ``top_p_sampling_from_probs`` (nucleus sampling).",
)
top_k_sampling_from_probs = _sampling_function(
    "top_k_sampling_from_probs",
    "probs",
    ("top_k",),
    "flashinfer's ``top_k_sampling_from_probs``.",
)
top_k_top_p_sampling_from_probs = _sampling_function(
    "top_k_top_p_sampling_from_probs",
    "probs",
    ("top_k", "top_p"),
    "flashinfer's ``top_k_top_p_sampling_from_probs``.",
)
top_k_top_p_sampling_from_logits = _sampling_function(
    "top_k_top_p_sampling_from_logits",
    "logits",
    ("top_k", "top_p"),
    "flashinfer's ``top_k_top_p_sampling_from_logits``: as from ``softmax(logits)``.",
)
min_p_sampling_from_probs = _sampling_function(
    "min_p_sampling_from_probs",
    "probs",
    ("min_p",),
    "flashinfer's ``min_p_sampling_from_probs``: keeps ``probs >= min_p * max``.",
    _min_p_api,
)


def softmax(
    logits: torch.Tensor,
    temperature: torch.Tensor | float | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """flashinfer's ``softmax``: float32 probabilities of ``logits / temperature``.

    ``temperature``: a number or one float value per row; ``enable_pdl`` is a CUDA
    launch option, ignored.
    """
    logits = as_float_matrix(logits, "logits")
    if temperature is None:
        return torch.softmax(logits, dim=-1)
    if isinstance(temperature, torch.Tensor):
        if temperature.dim() != 1:
            raise ValueError(
                "temperature tensor must be 1D with one value per logits row, got "
                f"shape {tuple(temperature.shape)}"
            )
        if temperature.shape[0] != logits.shape[0]:
            raise ValueError(
                f"temperature tensor length must equal logits.size(0) "
                f"({logits.shape[0]}), got {temperature.shape[0]}"
            )
        if temperature.device != logits.device:
            raise ValueError(
                f"temperature tensor must be on the same device as logits "
                f"({logits.device}), got {temperature.device}"
            )
        if not temperature.is_floating_point():
            raise ValueError(
                "temperature tensor must have dtype float16, bfloat16, float32, or "
                f"float64, got {temperature.dtype}"
            )
        return torch.softmax(logits / temperature.float().unsqueeze(1), dim=-1)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(
            "temperature must be None, a real scalar, or a 1D floating-point tensor "
            "with one value per logits row"
        )
    return torch.softmax(logits / float(temperature), dim=-1)


def _filtered(
    scores: torch.Tensor,
    what: str,
    top_k: torch.Tensor | int | None,
    top_p: torch.Tensor | float | None,
    fill: float,
) -> torch.Tensor:
    """A float32 copy of ``scores`` with the entries outside the filters set to
    ``fill`` (the input is untouched)."""
    return filter_scores(
        as_float_matrix(scores, what).clone(),
        top_k,
        top_p,
        scores_are_logits=what == "logits",
        fill=fill,
        strict=True,
    )


def _renorm(
    probs: torch.Tensor,
    top_k: torch.Tensor | int | None,
    top_p: torch.Tensor | float | None,
) -> torch.Tensor:
    kept = _filtered(probs, "probs", top_k, top_p, 0.0)
    return (kept / kept.sum(dim=-1, keepdim=True)).to(probs.dtype)


def top_p_renorm_probs(
    probs: torch.Tensor, top_p: torch.Tensor | float
) -> torch.Tensor:
    """flashinfer's ``top_p_renorm_probs``: the nucleus of each row, renormalised."""
    return _renorm(probs, None, top_p)


def top_k_renorm_probs(probs: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """flashinfer's ``top_k_renorm_probs``: the top-k of each row (ties kept),
    renormalised; same dtype as ``probs``."""
    return _renorm(probs, top_k, None)


def top_k_mask_logits(logits: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """flashinfer's ``top_k_mask_logits``: a copy with non-top-k logits set to -inf,
    same dtype as ``logits``."""
    return _filtered(logits, "logits", top_k, None, float("-inf")).to(logits.dtype)


top_p_renorm_prob = top_p_renorm_probs
top_k_renorm_prob = top_k_renorm_probs


def chain_speculative_sampling(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """flashinfer's ``chain_speculative_sampling`` (speculative sampling, one chain of
    ``n`` draft tokens per request).

    Draft token i is accepted when ``u * draft_prob < target_prob``; the first rejected
    position gets a token drawn from ``relu(target - draft)``, or, when all drafts are
    accepted, a bonus token from the last target distribution; later positions are -1.
    Returns (output ids (B, n + 1) int32, accepted counts, emitted counts); the counts
    are added in place to the tensors given. The accepted count also counts drafts
    after the first rejection that would be accepted on their own (a fresh uniform each).
    """
    draft_shape = tuple(draft_probs.shape)
    batch, n, vocab = draft_shape if len(draft_shape) == 3 else (-1, -1, -1)
    if (
        len(draft_shape) != 3
        or tuple(draft_token_ids.shape) != (batch, n)
        or tuple(target_probs.shape) != (batch, n + 1, vocab)
    ):
        raise ValueError(
            "expected draft_probs (batch, n, vocab), draft_token_ids (batch, n) and "
            f"target_probs (batch, n + 1, vocab); got {tuple(draft_probs.shape)}, "
            f"{tuple(draft_token_ids.shape)}, {tuple(target_probs.shape)}"
        )
    device = draft_probs.device
    draft = draft_probs.float()
    target = target_probs.float()
    ids = draft_token_ids.to(device=device, dtype=torch.int64)
    u = rng.uniforms(
        batch, 2 * n + 1, device, generator=generator, seed=seed, offset=offset
    )
    q = target[:, :n].gather(2, ids.unsqueeze(2)).squeeze(2)
    p = draft.gather(2, ids.unsqueeze(2)).squeeze(2)
    accept = u[:, :n] * p < q
    # First rejected position (n when all are accepted).
    pos = accept.to(torch.int64).cumprod(dim=1).sum(dim=1)
    positions = torch.arange(n, device=device).unsqueeze(0)
    again = (u[:, n : 2 * n] * p < q) & (positions >= pos.unsqueeze(1))
    accepted = pos + again.sum(dim=1)
    # Residual distribution at the first rejected position (the bonus: target only).
    index = pos.view(batch, 1, 1).expand(batch, 1, vocab)
    residual = target.gather(1, index).squeeze(1)
    drafted = draft.gather(1, index.clamp(max=max(n - 1, 0))).squeeze(1) if n else None
    if drafted is not None:
        residual = (residual - drafted * (pos < n).unsqueeze(1)).clamp_(min=0)
    token = draw_ops.draw_with_mass(residual.contiguous(), u[:, 2 * n])[0]
    out = torch.where(positions < pos.unsqueeze(1), ids, torch.full_like(ids, -1))
    out = torch.cat([out, torch.full_like(ids[:, :1], -1)], dim=1)
    out.scatter_(1, pos.unsqueeze(1), token.unsqueeze(1))
    if maybe_output_accepted_token_num is None:
        accepted_out = torch.zeros(batch, dtype=torch.int32, device=device)
    else:
        accepted_out = maybe_output_accepted_token_num
    if maybe_output_emitted_draft_token_num is None:
        emitted_out = torch.zeros(batch, dtype=torch.int32, device=device)
    else:
        emitted_out = maybe_output_emitted_draft_token_num
    accepted_out.add_(accepted.to(accepted_out.dtype))
    emitted_out.add_(pos.to(emitted_out.dtype))
    return out.to(torch.int32), accepted_out, emitted_out
