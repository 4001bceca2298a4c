"""The W8A8 int8 linear seam: Kunlun's vendor kernels, or the portable torch path.

Why: W8A8-INT8 checkpoints (compressed-tensors, the log's ``-W8A8-INT8-Dynamic``) need
an int8 GEMM with per-token activation quantization. vLLM's own kernels need
``vllm._C``; on Kunlun the vendor libraries have the kernels, elsewhere
``int8_mm_portable`` computes the same thing in plain torch.

Vendor calls (declared in ``ops/contract.py``, checked by the doctor), the ones the
upstream Kunlun plugin makes for this scheme:
- symmetric activations: ``kunlun_ops.quant2d`` (dynamic: int8 rows plus the per-row
  absmax in ``max``) or ``xspeedgate_ops.static_scaled_int8_quant`` (static), then
  ``kunlun_ops.matmul`` with absmax-style scales: ``x_pc_max`` = per-token absmax
  (static: ``input_scale * 127``) and ``w_pc_max`` = ``weight_scale * 127``; the
  kernel divides both by 127.
- asymmetric activations (azp): ``xspeedgate_ops.dynamic_scaled_int8_quant`` /
  ``static_scaled_int8_quant`` and ``xspeedgate_ops.cutlass_scaled_mm_azp``, which take
  vLLM's own ``_C`` signatures and scales. The xspeedgate ops are torch custom ops
  (``torch.ops.xspeedgate_ops.*``, registered when ``xspeedgate_ops`` is imported).

``VLLM_KUNLUN_INT8_MM`` chooses: ``auto`` (vendor where the active platform wants
vendor kernels and every op is there, else portable), ``vendor`` (fail when missing),
``portable``; ``ops/chooser.py`` makes the choice and logs it once per device.

Both paths run behind one torch custom op, ``torch.ops.vllm_kunlun.int8_scaled_mm``, so
that torch.compile sees one opaque op with a fake implementation instead of vendor
builtins it cannot trace. Removal: when vLLM ships int8 kernels for out-of-tree
platforms that load on the validated torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_kunlun.ops import chooser, vendor
from vllm_kunlun.ops.int8 import portable
from vllm_kunlun.ops.plugin_op import NAMESPACE, PluginOp

VENDOR = chooser.VENDOR
PORTABLE = chooser.PORTABLE
# (module, function) pairs the vendor path calls; ops/contract.py declares them.
KUNLUN_OPS = ("quant2d", "matmul")
XSPEEDGATE_OPS = (
    "dynamic_scaled_int8_quant",
    "static_scaled_int8_quant",
    "cutlass_scaled_mm_azp",
)


@dataclass(frozen=True)
class VendorInt8:
    """The vendor functions the int8 path calls, resolved once."""

    quant2d: Callable[..., Any]
    matmul: Callable[..., Any]
    xspeedgate: dict[str, Callable[..., Any]] = field(default_factory=dict)

    def linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        input_scale: torch.Tensor | None = None,
        input_zero_point: torch.Tensor | None = None,
        azp_adj: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``portable.int8_linear`` on the vendor kernels."""
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        m, n = x2.shape[0], weight.shape[0]
        x_q = torch.empty_like(x2, dtype=torch.int8)
        bias32 = None if bias is None else bias.to(torch.float32).contiguous()
        if azp_adj is None:  # symmetric: the absmax-style GEMM
            if input_scale is None:
                x_max = torch.empty((m, 1), dtype=torch.float32, device=x2.device)
                self.quant2d(x=x2, y=x_q, max=x_max, force_sdnn=True)
            else:
                self.xspeedgate["static_scaled_int8_quant"](x_q, x2, input_scale, None)
                x_max = input_scale * 127.0
            out = torch.empty((m, n), dtype=x.dtype, device=x2.device)
            self.matmul(
                x=x_q,
                w=weight,
                out=out,
                x_trans=False,
                w_trans=True,
                alpha=1.0,
                beta=0.0,
                bias=bias32,
                x_max=None,
                w_max=None,
                x_pc_max=x_max,
                w_pc_max=weight_scale.reshape(-1, 1) * 127.0,
            )
        else:  # asymmetric: vLLM's cutlass_scaled_mm_azp signature
            if input_scale is None:
                scale = torch.empty((m, 1), dtype=torch.float32, device=x2.device)
                azp: torch.Tensor | None = torch.empty_like(scale, dtype=torch.int32)
                self.xspeedgate["dynamic_scaled_int8_quant"](x_q, x2, scale, azp)
            else:
                scale, azp = input_scale, None  # the zero point is folded in azp_adj
                self.xspeedgate["static_scaled_int8_quant"](
                    x_q, x2, input_scale, input_zero_point
                )
            out = torch.empty((m, n), dtype=x.dtype, device=x2.device)
            # [K, N] row-major, as upstream passes it (a copy per call: azp layers are
            # rare; the log's checkpoint is symmetric).
            self.xspeedgate["cutlass_scaled_mm_azp"](
                out,
                x_q,
                weight.t().contiguous(),
                scale,
                weight_scale.reshape(1, -1),
                azp_adj.reshape(1, -1),
                azp,
                bias32,
            )
        return out.reshape(*x.shape[:-1], n)


@dataclass(frozen=True)
class Int8Kernels:
    """The int8 linear one device uses, and why."""

    name: str
    reason: str
    vendor_ops: VendorInt8 | None = None

    @property
    def linear(self) -> Callable[..., torch.Tensor]:
        """``portable.int8_linear``'s call (positional or by name) on the chosen path."""
        if self.vendor_ops is not None:
            return self.vendor_ops.linear
        return portable.int8_linear


def load_vendor() -> tuple[VendorInt8 | None, str]:
    """The vendor functions, or None and what is missing."""
    found: dict[str, Any] = {}
    missing = []
    for module, names in (
        ("kunlun_ops", KUNLUN_OPS),
        ("xspeedgate_ops", XSPEEDGATE_OPS),
    ):
        for name in names:
            fn, why = vendor.function(module, name)
            if fn is None:
                missing.append(why)
            found[name] = fn
    if missing:
        return None, "; ".join(dict.fromkeys(missing))
    return (
        VendorInt8(
            found["quant2d"],
            found["matmul"],
            {name: found[name] for name in XSPEEDGATE_OPS},
        ),
        "kunlun_ops and xspeedgate_ops int8 ops are available",
    )


_selected: dict[torch.device, Int8Kernels] = {}


def select_kernels(device: torch.device | str) -> Int8Kernels:
    """The int8 linear for tensors on ``device``, per ``VLLM_KUNLUN_INT8_MM``; the
    choice is made and logged once per device and process."""
    device = torch.device(device)
    if device in _selected:
        return _selected[device]
    choice = chooser.choose(chooser.INT8_MM, device, vendor=load_vendor)
    kernels = Int8Kernels(choice.name, choice.reason, choice.vendor)
    _selected[device] = kernels
    return kernels


def reset_selection() -> None:
    """Forget the per-device choices (tests switch VLLM_KUNLUN_INT8_MM)."""
    _selected.clear()


# ---- one custom op for both paths ---------------------------------------------------

OP_NAMESPACE = NAMESPACE
OP_NAME = "int8_scaled_mm"
_SCHEMA = (
    "int8_scaled_mm(Tensor x, Tensor weight, Tensor weight_scale, Tensor? input_scale, "
    "Tensor? input_zero_point, Tensor? azp_adj, Tensor? bias) -> Tensor"
)


def _impl(x: torch.Tensor, *rest: torch.Tensor | None) -> torch.Tensor:
    """The schema's arguments, in its order, to ``Int8Kernels.linear`` of x's device."""
    return select_kernels(x.device).linear(x, *rest)  # type: ignore[arg-type]


def _fake(x: torch.Tensor, weight: torch.Tensor, *scales_and_bias: Any) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


_OP = PluginOp(_SCHEMA, _impl, _fake)


def register_op() -> Callable[..., torch.Tensor]:
    """Define ``torch.ops.vllm_kunlun.int8_scaled_mm`` once per process; returns it."""
    return _OP.get()
