"""The weight-only integer linear seam (W4A16 / W8A16): Kunlun's GPTQ GEMM, or the
portable chunked torch kernel.

Why: compressed-tensors ``pack-quantized`` checkpoints (4-bit and 8-bit weights, group
or channel scales) need a mixed-precision GEMM; vLLM's own kernels need ``vllm._C``.
On Kunlun the vendor library has ``torch.ops.xspeedgate_ops.gptq_gemm``; elsewhere
``ops/int4/portable.py`` computes the same product in plain torch.

Vendor call (declared in ``ops/contract.py``; call form in ``docs/vendor-calls.md``),
positional as the upstream Kunlun plugin passes it: ``gptq_gemm(x, qweight, qzeros,
scales, g_idx, use_exllama, bits)`` with vLLM's GPTQ layouts: ``qweight`` ``[K / f, N]``
int32 packed along K, ``qzeros`` ``[G, N / f]`` int32 holding ``zero - 1`` (the GPTQ v1
convention: the kernel adds 1), ``scales`` ``[G, N]``, ``g_idx`` ``[K]`` int32. The seam
passes ``use_exllama=False`` (the kernel reads ``g_idx`` directly, so no
``gptq_shuffle`` of the weight is needed) and uses the vendor kernel for symmetric
weights only: an asymmetric zero point of 0 has no GPTQ v1 encoding (``0 - 1`` wraps to
the largest value), so such layers run portable, logged once. The fake
(``tests/fakes/xspeedgate_ops/_gptq.py``) implements these semantics; hardware must
confirm the real kernel computes them.

No switch: ``ops/chooser.py`` takes the vendor kernel where the active platform wants
vendor kernels and it loads, else portable; the choice is logged once per device. The
layout is chosen when a layer's weights are loaded (``prepare``), and each call goes
through one torch custom op (``torch.ops.vllm_kunlun.wna16_mm``) so torch.compile sees
one opaque node. Removal: when vLLM's mixed-precision kernels run on Kunlun.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vllm_kunlun.logger import init_logger
from vllm_kunlun.ops import chooser, vendor
from vllm_kunlun.ops.int4 import portable
from vllm_kunlun.ops.plugin_op import PluginOp

logger = init_logger(__name__)

VENDOR = chooser.VENDOR
PORTABLE = chooser.PORTABLE
VENDOR_MODULE = "xspeedgate_ops"
GPTQ_GEMM = "gptq_gemm"


# The weight-only linear path one device uses, and why: the chooser's own choice, as it
# comes (``vendor``: ``xspeedgate_ops.gptq_gemm``).
Wna16Kernels = chooser.Choice[Callable[..., Any]]


def load_vendor() -> tuple[Callable[..., Any] | None, str]:
    fn, why = vendor.function(VENDOR_MODULE, GPTQ_GEMM)
    return fn, why


SEAM: chooser.DeviceSeam[Callable[..., Any], Wna16Kernels] = chooser.DeviceSeam(
    chooser.WNA16_MM, load_vendor, lambda c: c
)
select_kernels = SEAM.select
reset = SEAM.reset
served = SEAM.served


@dataclass
class Prepared:
    """One layer's tensors in the layout of the path that serves it."""

    gptq_layout: bool
    weight: torch.Tensor  # portable: [N, K/f] packed along K; vendor: [K/f, N]
    scales: torch.Tensor  # portable: [N, G]; vendor: [G, N]
    zeros: torch.Tensor | None  # portable: [N, G] unsigned or None; vendor: [G, N/f]
    index: torch.Tensor | None  # portable: K permutation or None; vendor: g_idx [K]
    groups: torch.Tensor | None = None  # portable: each permuted column's group


def prepare(
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    g_idx: torch.Tensor | None,
    bits: int,
    group_size: int,
    act_dtype: torch.dtype,
) -> Prepared:
    """Lay out one layer (``packed`` ``[N, K/f]`` along K, ``scales`` ``[N, G]``,
    ``zeros`` ``[N, G]`` unsigned or None, ``g_idx`` ``[K]`` or None) for the path
    chosen for its device."""
    kernels = select_kernels(packed.device)
    k = packed.shape[1] * portable.pack_factor(bits)
    gs = k if group_size <= 0 else group_size
    if kernels.vendor is not None and zeros is None:
        q = portable.unpack_cols(packed, bits)  # [N, K]
        n, groups = q.shape[0], scales.shape[1]
        qweight = portable.pack_cols(q, bits).t().contiguous()  # [K/f, N]
        bias = (1 << (bits - 1)) - 1  # GPTQ v1: the kernel adds 1
        qzeros = portable.pack_cols(
            torch.full((groups, n), bias, dtype=torch.int32, device=q.device), bits
        )
        if g_idx is None:
            g_idx = torch.arange(k, device=q.device) // gs
        return Prepared(
            True,
            qweight,
            scales.t().to(act_dtype).contiguous(),
            qzeros,
            g_idx.to(torch.int32).contiguous(),
        )
    if kernels.vendor is not None:
        logger.info_once(
            "vllm-kunlun: asymmetric weight-only layers run the portable kernel (the "
            "vendor gptq_gemm has no encoding for a zero point of 0)"
        )
    perm = groups = None
    if g_idx is not None:
        packed, perm, groups = portable.sort_by_group(packed, g_idx, bits)
    return Prepared(
        False, packed.contiguous(), scales.contiguous(), zeros, perm, groups
    )


_EXTRA = ("wna16_zeros", "wna16_index", "wna16_groups")


def attach(
    layer: torch.nn.Module, p: Prepared, weight_name: str, scales_name: str
) -> None:
    """Store ``p`` on ``layer`` as parameters (they follow the layer's device moves):
    the weight and scales under the layer's own names, the rest under ``wna16_*``."""
    for name, t in zip(
        (weight_name, scales_name, *_EXTRA),
        (p.weight, p.scales, p.zeros, p.index, p.groups),
        strict=True,
    ):
        if name in layer._parameters or hasattr(layer, name):
            delattr(layer, name)
        param = None if t is None else torch.nn.Parameter(t, requires_grad=False)
        layer.register_parameter(name, param)


def attached(
    layer: torch.nn.Module, gptq_layout: bool, weight_name: str, scales_name: str
) -> Prepared:
    """The ``Prepared`` that ``attach`` stored on ``layer``."""
    zeros, index, groups = (getattr(layer, n, None) for n in _EXTRA)
    return Prepared(
        gptq_layout,
        getattr(layer, weight_name),
        getattr(layer, scales_name),
        zeros,
        index,
        groups,
    )


def _impl(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    index: torch.Tensor | None,
    groups: torch.Tensor | None,
    bias: torch.Tensor | None,
    bits: int,
    group_size: int,
    gptq_layout: bool,
) -> torch.Tensor:
    kernels = select_kernels(x.device)
    if not gptq_layout:
        SEAM.record(x.device, PORTABLE, kernels.reason)
        return portable.wna16_linear(
            x, weight, scales, zeros, bits, group_size, index, bias, groups
        )
    if kernels.vendor is None:
        raise RuntimeError(
            "vllm-kunlun: a layer laid out for the vendor gptq_gemm runs on "
            f"{x.device}, where {kernels.reason}"
        )
    SEAM.record(x.device, VENDOR, kernels.reason)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    out = kernels.vendor(x2, weight, zeros, scales, index, False, bits)
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.reshape(*x.shape[:-1], out.shape[-1])  # type: ignore[no-any-return]


def _fake(x: torch.Tensor, weight: torch.Tensor, *rest: Any) -> torch.Tensor:
    """The output's shape only; ``rest`` is ``_impl``'s, ending with ``gptq_layout``."""
    n = weight.shape[1] if rest[-1] else weight.shape[0]
    return x.new_empty((*x.shape[:-1], n))


_OP = PluginOp(
    "wna16_mm(Tensor x, Tensor weight, Tensor scales, Tensor? zeros, Tensor? index, "
    "Tensor? groups, Tensor? bias, int bits, int group_size, bool gptq_layout) -> Tensor",
    _impl,
    _fake,
)


def wna16_mm(
    x: torch.Tensor, p: Prepared, bias: torch.Tensor | None, bits: int, group_size: int
) -> torch.Tensor:
    """The layer's output for ``x`` [..., K] through ``torch.ops.vllm_kunlun.wna16_mm``."""
    return _OP.get()(  # type: ignore[no-any-return]
        x,
        p.weight,
        p.scales,
        p.zeros,
        p.index,
        p.groups,
        bias,
        bits,
        group_size,
        p.gptq_layout,
    )
