"""Fake ``kunlun_ops`` int8 kernels: ``quant2d`` and ``matmul`` as the plugin calls them.

Semantics as the upstream Kunlun plugin uses them (absmax-style scales): ``quant2d``
writes each row's absolute maximum into ``max`` and ``rne(x * 127 / max)`` into ``y``;
``matmul`` with ``w_trans=True`` takes the weight as ``[N, K]`` and scales the exact
int32 product by ``x_pc_max / 127`` per row and ``w_pc_max / 127`` per column. Written
independently of the plugin's portable kernel (float64 arithmetic here), so a test that
compares the two compares two implementations. Inputs are checked the way a device
kernel would need them (dtypes, contiguity, shapes); every call is recorded.
"""

from __future__ import annotations

import torch

from kunlun_ops import _record


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise ValueError(what)


def quant2d(x, y, max, force_sdnn=False):
    _need(x.dim() == 2 and x.is_contiguous(), "quant2d: x must be contiguous 2-D")
    _need(
        y.dtype == torch.int8 and y.shape == x.shape, "quant2d: y must be int8 like x"
    )
    _need(
        max.dtype == torch.float32 and max.numel() == x.shape[0],
        "quant2d: max must hold one float32 per row",
    )
    _record("quant2d", x=x, force_sdnn=force_sdnn)
    amax = x.double().abs().amax(dim=1, keepdim=True)
    q = torch.where(amax > 0, x.double() * 127.0 / amax, torch.zeros_like(amax))
    y.copy_(q.round().clamp(-128, 127).to(torch.int8))
    max.copy_(amax.reshape(max.shape))


def matmul(
    x,
    w,
    out,
    x_trans=False,
    w_trans=True,
    alpha=1.0,
    beta=0.0,
    bias=None,
    x_max=None,
    w_max=None,
    x_pc_max=None,
    w_pc_max=None,
):
    _need(not x_trans and w_trans, "matmul fake: only x [M, K] @ w[N, K]^T")
    _need(x.dtype == w.dtype == torch.int8, "matmul: int8 x and w")
    _need(x.is_contiguous() and w.is_contiguous(), "matmul: contiguous x and w")
    m, n = x.shape[0], w.shape[0]
    _need(x.shape[1] == w.shape[1], "matmul: K differs")
    _need(out.shape == (m, n), f"matmul: out must be {(m, n)}")
    _need(x_pc_max is not None and x_pc_max.numel() in (1, m), "matmul: x_pc_max")
    _need(w_pc_max is not None and w_pc_max.numel() == n, "matmul: w_pc_max per column")
    _need(bias is None or bias.dtype == torch.float32, "matmul: float32 bias")
    _record(
        "matmul",
        x=x,
        w=w,
        bias=bias,
        x_pc_max=x_pc_max,
        w_pc_max=w_pc_max,
        alpha=alpha,
        beta=beta,
        out_dtype=out.dtype,
    )
    acc = (x.long() @ w.long().t()).double()
    xs = x_pc_max.double().reshape(-1, 1) / 127.0
    ws = w_pc_max.double().reshape(1, -1) / 127.0
    res = alpha * acc * xs * ws
    if bias is not None:
        res = res + bias.double()
    out.copy_(res.to(out.dtype))
