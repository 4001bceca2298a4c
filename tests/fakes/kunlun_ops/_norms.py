"""Fake RMSNorm-family kernels: rmsnorm, add_rmsnorm, gemma_(add_)rmsnorm, rms_norm_gated.

Call forms as upstream uses them (see vllm_kunlun/ops/custom_ops/norms_vendor.py): contiguous 2-D inputs
of one float dtype, fresh or aliased outputs written in place, statistics in float32,
``residual_output`` the sum before the norm, Gemma's scale ``1 + weight``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kunlun_ops._kernel_common import (
    FLOATS,
    check_same,
    check_tensor,
    fail,
    record,
    unmodeled,
)

__all__ = [
    "add_rmsnorm",
    "gemma_add_rmsnorm",
    "gemma_rmsnorm",
    "rms_norm_gated",
    "rmsnorm",
]


def _rows(kernel: str, x: Any, weight: Any, **outputs: Any) -> torch.Tensor:
    check_tensor(kernel, "x", x, dtypes=FLOATS, dim=2)
    check_same(kernel, "x", x, weight=weight, **outputs)
    if weight.shape != (x.shape[1],):
        fail(kernel, f"weight {tuple(weight.shape)} for rows of {x.shape[1]}")
    for name, t in outputs.items():
        if t.shape != x.shape:
            fail(kernel, f"{name} {tuple(t.shape)} for x {tuple(x.shape)}")
    return x


def _normed(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rmsnorm(x, weight, output, eps, /):
    record("rmsnorm", x=x, weight=weight, output=output, eps=eps)
    _rows("rmsnorm", x, weight, output=output)
    output.copy_(_normed(x.float(), eps) * weight.float())


def add_rmsnorm(x, y, /, *, residual_output, weight, eps, output):
    record(
        "add_rmsnorm",
        x=x,
        y=y,
        residual_output=residual_output,
        weight=weight,
        eps=eps,
        output=output,
    )
    _rows("add_rmsnorm", x, weight, y=y, residual_output=residual_output, output=output)
    total = x.float() + y.float()
    residual_output.copy_(total)
    output.copy_(_normed(total, eps) * weight.float())


def gemma_rmsnorm(x, weight, output, eps, enable_pdl, interweave, bias, force_sdnn, /):
    name = "gemma_rmsnorm"
    record(
        name,
        x=x,
        weight=weight,
        output=output,
        eps=eps,
        enable_pdl=enable_pdl,
        interweave=interweave,
        bias=bias,
        force_sdnn=force_sdnn,
    )
    unmodeled(
        name,
        enable_pdl=(enable_pdl, False),
        interweave=(interweave, False),
        bias=(bias, None),
        force_sdnn=(force_sdnn, False),
    )
    _rows(name, x, weight, output=output)
    output.copy_(_normed(x.float(), eps) * (1.0 + weight.float()))


def gemma_add_rmsnorm(
    x,
    y,
    /,
    *,
    weight,
    output,
    eps,
    enable_pdl=False,
    interweaved=False,
    store_output_before_norm=True,
    bias=None,
    smooth=None,
    residual_output=None,
    force_sdnn=False,
):
    name = "gemma_add_rmsnorm"
    record(
        name,
        x=x,
        y=y,
        weight=weight,
        output=output,
        eps=eps,
        residual_output=residual_output,
        store_output_before_norm=store_output_before_norm,
    )
    unmodeled(
        name,
        enable_pdl=(enable_pdl, False),
        interweaved=(interweaved, False),
        store_output_before_norm=(store_output_before_norm, True),
        bias=(bias, None),
        smooth=(smooth, None),
        force_sdnn=(force_sdnn, False),
    )
    if residual_output is None:
        fail(name, "the fake models residual_output given")
    _rows(name, x, weight, y=y, residual_output=residual_output, output=output)
    total = x.float() + y.float()
    residual_output.copy_(total)
    output.copy_(_normed(total, eps) * (1.0 + weight.float()))


def rms_norm_gated(
    x, output, z, weight, eps, group_size, norm_before_gate, is_rms_norm, /
):
    name = "rms_norm_gated"
    record(
        name,
        x=x,
        output=output,
        z=z,
        weight=weight,
        eps=eps,
        group_size=group_size,
        norm_before_gate=norm_before_gate,
        is_rms_norm=is_rms_norm,
    )
    unmodeled(name, is_rms_norm=(is_rms_norm, True))
    _rows(name, x, weight, output=output, z=z)
    hidden = x.shape[1]
    if not isinstance(group_size, int) or group_size <= 0 or hidden % group_size:
        fail(name, f"group_size {group_size!r} does not divide {hidden}")
    h, gate = x.float(), F.silu(z.float())
    if not norm_before_gate:
        h = h * gate
    groups = h.view(h.shape[0], hidden // group_size, group_size)
    h = _normed(groups, eps).view_as(h) * weight.float()
    if norm_before_gate:
        h = h * gate
    output.copy_(h)
