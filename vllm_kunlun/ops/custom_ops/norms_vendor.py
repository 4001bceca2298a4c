"""RMSNorm family on the vendor kernels: one call form each, and what it assumes.

Why: vLLM's native RMSNorm is five small torch kernels per call (and ten with the
residual add); the vendor library has one fused kernel for each form. The CustomOps in
``ops/custom_ops/norms_vendor.py`` call these wrappers and fall back to vLLM's native path when
one raises ``Refused``.

The call forms are upstream's (facts in ``docs/vendor-calls.md``);
what each one assumes about the kernel is said at the function. Common to all: the
kernels take contiguous 2-D ``[rows, hidden]`` tensors of one float dtype on one device
and write into the ``output`` tensors they are given (we always pass fresh ones, so no
assumption about in-place aliasing is made).

Removal: never; this is the vendor seam for these ops.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vllm_kunlun.ops.routes import FLOAT_DTYPES, Kernels, Refused


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a contiguous ``[rows, hidden]`` tensor (a view when it already is)."""
    return x.contiguous().view(-1, x.shape[-1])


def _check(x: torch.Tensor, weight: torch.Tensor, *others: torch.Tensor | None) -> None:
    if x.dtype not in FLOAT_DTYPES:
        raise Refused(f"input dtype {x.dtype} is not a kernel dtype")
    if weight.dtype != x.dtype:
        raise Refused(
            f"weight dtype {weight.dtype} differs from input dtype {x.dtype} (vLLM "
            "then promotes the result; the kernels write the input dtype)"
        )
    if weight.shape != (x.shape[-1],):
        raise Refused(f"weight shape {tuple(weight.shape)} for hidden {x.shape[-1]}")
    for t in others:
        if t is not None and (t.shape != x.shape or t.dtype != x.dtype):
            raise Refused(
                f"second input {t.dtype} {tuple(t.shape)} does not match the input "
                f"{x.dtype} {tuple(x.shape)}"
            )


def _norm_rows(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    norm: Callable[[torch.Tensor, torch.Tensor], object],
    add_norm: Callable[
        [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], object
    ],
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The frame of the (fused add +) norm kernels: ``norm(x2, out)`` over the rows of
    ``x``, or with the residual ``add_norm(x2, residual2, out, residual_out)``; returns
    what vLLM's forward returns, in ``x``'s shape."""
    _check(x, weight, residual)
    x2 = _rows(x)
    out = torch.empty_like(x2)
    if residual is None:
        norm(x2, out)
        return out.view(x.shape)
    res_out = torch.empty_like(x2)
    add_norm(x2, _rows(residual), out, res_out)
    return out.view(x.shape), res_out.view(x.shape)


def rms_norm(
    k: Kernels,
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    variance_size_override: int | None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """vLLM's ``RMSNorm.forward``: ``x / rms(x) * w``, or with the residual:
    ``(norm(x + residual), x + residual)``.

    Assumes ``kunlun_ops.rmsnorm(x, weight, output, eps)`` and
    ``add_rmsnorm(x, y, residual_output=, weight=, eps=, output=)`` (upstream's forms)
    with ``residual_output = x + y`` (the sum before the norm) and statistics in float32.
    """
    if variance_size_override is not None:
        raise Refused("var_hidden_size (variance over part of the row) is no argument")
    return _norm_rows(
        x,
        residual,
        weight,
        lambda x2, out: k["rmsnorm"](x2, weight, out, eps),
        lambda x2, r2, out, res_out: k["add_rmsnorm"](
            x2, r2, residual_output=res_out, weight=weight, eps=eps, output=out
        ),
    )


def gemma_rms_norm(
    k: Kernels,
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """vLLM's ``GemmaRMSNorm.forward``: the same with ``(1 + w)`` as the scale.

    Assumes the kernels apply ``1 + weight`` themselves (upstream hands them the raw
    Gemma weight), ``gemma_rmsnorm`` positional as upstream calls it (with
    ``enable_pdl, interweave, bias, force_sdnn`` = False, False, None, False) and
    ``gemma_add_rmsnorm(x, y, weight=, output=, eps=, residual_output=,
    store_output_before_norm=True)`` storing ``x + y`` in ``residual_output``.
    """
    return _norm_rows(
        x,
        residual,
        weight,
        lambda x2, out: k["gemma_rmsnorm"](
            x2, weight, out, eps, False, False, None, False
        ),
        lambda x2, r2, out, res_out: k["gemma_add_rmsnorm"](
            x2,
            r2,
            weight=weight,
            output=out,
            eps=eps,
            residual_output=res_out,
            store_output_before_norm=True,
        ),
    )


def rms_norm_gated(
    k: Kernels,
    x: torch.Tensor,
    z: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    group_size: int | None,
    norm_before_gate: bool,
) -> torch.Tensor:
    """vLLM's ``RMSNormGated.forward``: ``norm(x) * silu(z)`` (``norm_before_gate``)
    or ``norm(x * silu(z))``, each group of ``group_size`` columns normed alone.

    Assumes ``kunlun_ops.rms_norm_gated(x, output, z, weight, eps, group_size,
    norm_before_gate, is_rms_norm)`` (upstream's positional form, ``is_rms_norm``
    True); ``group_size`` is passed as the row width when vLLM has None (one group).
    Without a gate (``z`` None) the call is refused: upstream always passes one.
    """
    if z is None:
        raise Refused("no gate (z is None); the observed call form always has one")
    _check(x, weight, z)
    hidden = x.shape[-1]
    group = hidden if group_size is None else group_size
    if group <= 0 or hidden % group:
        raise Refused(f"group_size {group_size} does not divide hidden {hidden}")
    x2 = _rows(x)
    out = torch.empty_like(x2)
    k["rms_norm_gated"](x2, out, _rows(z), weight, eps, group, norm_before_gate, True)
    return out.view(x.shape)
