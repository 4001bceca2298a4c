"""Fake ``torch.ops.xspeedgate_ops`` int8 kernels with vLLM's ``_C`` signatures.

``dynamic_scaled_int8_quant(out, input, scale, azp)``, ``static_scaled_int8_quant(out,
input, scale, azp)`` and ``cutlass_scaled_mm_azp(out, a, b, scale_a, scale_b, azp_adj,
azp, bias)`` with the semantics of vLLM's CUDA kernels (per-token absmax / 127; min-max
with a zero point; ``out = scale_a * scale_b * (a @ b - azp * azp_adj) + bias`` with
``b`` as ``[K, N]``), computed here in float64 / int64 independently of the plugin's
portable kernel. Registered once per process; the implementations look this module up
at call time, so a re-imported fake still records into the current ``CALLS``.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

CALLS: list[tuple[str, dict[str, Any]]] = []

_SCHEMAS = {
    "dynamic_scaled_int8_quant": (
        "dynamic_scaled_int8_quant(Tensor(a!) result, Tensor input, Tensor(b!) scale, "
        "Tensor(c!)? azp) -> ()"
    ),
    "static_scaled_int8_quant": (
        "static_scaled_int8_quant(Tensor(a!) result, Tensor input, Tensor scale, "
        "Tensor? azp) -> ()"
    ),
    "cutlass_scaled_mm_azp": (
        "cutlass_scaled_mm_azp(Tensor(a!) out, Tensor a, Tensor b, Tensor a_scales, "
        "Tensor b_scales, Tensor azp_adj, Tensor? azp, Tensor? bias) -> ()"
    ),
}


def reset() -> None:
    CALLS.clear()


def _rec(name: str, **kw: Any) -> None:
    CALLS.append(
        (name, {k: v.clone() if torch.is_tensor(v) else v for k, v in kw.items()})
    )


def _sat8(v: torch.Tensor) -> torch.Tensor:
    return v.round().clamp(-128, 127).to(torch.int8)


def dynamic_scaled_int8_quant(result, input, scale, azp):
    assert input.is_contiguous() and result.dtype == torch.int8
    _rec("dynamic_scaled_int8_quant", input=input, symmetric=azp is None)
    x = input.double().reshape(-1, input.shape[-1])
    if azp is None:
        amax = x.abs().amax(dim=1, keepdim=True)
        s = amax / 127.0
        result.copy_(
            _sat8(torch.where(amax > 0, x / s, torch.zeros_like(x))).view_as(result)
        )
        scale.copy_(s.reshape(scale.shape))
        return
    lo, hi = x.amin(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)
    s = (hi - lo) / 255.0
    zp = (-128.0 - lo / s).round()
    result.copy_(_sat8(x / s + zp).view_as(result))
    scale.copy_(s.reshape(scale.shape))
    azp.copy_(zp.reshape(azp.shape).to(torch.int32))


def static_scaled_int8_quant(result, input, scale, azp):
    assert input.is_contiguous() and scale.numel() == 1
    _rec("static_scaled_int8_quant", input=input, scale=scale, azp=azp)
    q = input.double() / scale.double()
    if azp is not None:
        q = q.round() + azp.double()
    result.copy_(_sat8(q))


def cutlass_scaled_mm_azp(out, a, b, a_scales, b_scales, azp_adj, azp, bias):
    assert a.dtype == b.dtype == torch.int8 and b.is_contiguous()
    assert a.shape[1] == b.shape[0] and out.shape == (a.shape[0], b.shape[1])
    _rec("cutlass_scaled_mm_azp", a=a, b=b, azp_adj=azp_adj, azp=azp, bias=bias)
    acc = a.long() @ b.long()
    adj = azp_adj.long().reshape(1, -1)
    acc = acc - (adj if azp is None else azp.long().reshape(-1, 1) * adj)
    sa = a_scales.double().reshape(-1, 1) if a_scales.numel() > 1 else a_scales.double()
    res = acc.double() * b_scales.double().reshape(1, -1) * sa.reshape(-1, 1)
    if bias is not None:
        res = res + bias.double()
    out.copy_(res.to(out.dtype))


def _dispatch(name: str):
    def call(*args: Any) -> None:
        getattr(sys.modules[__name__], name)(*args)

    return call


if not hasattr(torch.ops.xspeedgate_ops, "cutlass_scaled_mm_azp"):
    _LIB = torch.library.Library("xspeedgate_ops", "FRAGMENT")
    for _name, _schema in _SCHEMAS.items():
        _LIB.define(_schema)
        _LIB.impl(_name, _dispatch(_name), "CompositeExplicitAutograd")
