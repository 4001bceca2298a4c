"""The MoE seam: Kunlun's fused MoE block, or the portable grouped experts.

Why: Qwen3.5-MoE's routed experts (256 experts, top-8 in the 35B-A3B) need a grouped
expert kernel. vLLM's fused MoE is Triton / ``vllm._C`` and does not run here; on Kunlun
the vendor library has one call for the whole routed block, elsewhere
``ops/moe/portable.py`` computes the same thing in plain torch.

Vendor call (declared in ``ops/contract.py``, checked by the doctor; the call form in
``docs/vendor-calls.md``): ``kunlun_ops.moe_ffn_block`` with every argument by keyword,
as the upstream Kunlun plugin calls it: the router weight ``gate_w`` [E, H], ``inter_w``
= w13 [E, 2I, H], ``output_w`` = w2 [E, H, I], softmax top-k routing
(``use_grouped_topk=False``, ``expert_group_num=0``, ``topk_group=0``: upstream's values
for ungrouped routing), written into ``out``. Observed usage pins the keywords, not
their semantics: the fake (``tests/fakes/kunlun_ops/_moe.py``) implements
transformers' semantics, and hardware must confirm the real kernel computes them.

The vendor path serves float weights without expert parallelism only (the call takes
all ``expert_num`` experts and no scales). int8 experts and expert-parallel slices run
the portable kernel (whose int8 matmuls go through the int8 seam, vendor where it is
chosen); the reason is logged once.

There is no switch: ``ops/chooser.py`` takes the vendor kernel where the active platform
wants vendor kernels and it loads, else portable, and logs the choice once per device.
Both paths run behind one torch custom op, ``torch.ops.vllm_kunlun.moe_forward``, so
torch.compile sees one opaque op (the per-expert loop is data-dependent and must not be
traced). Removal: when vLLM's fused MoE runs on the validated torch without Triton.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_kunlun.logger import init_logger
from vllm_kunlun.ops import chooser, vendor
from vllm_kunlun.ops.moe import portable
from vllm_kunlun.ops.plugin_op import NAMESPACE, PluginOp

logger = init_logger(__name__)

VENDOR = chooser.VENDOR
PORTABLE = chooser.PORTABLE
VENDOR_MODULE = "kunlun_ops"
VENDOR_FUNCTION = "moe_ffn_block"
# Ungrouped softmax top-k routing, as upstream passes it (docs/vendor-calls.md).
UNGROUPED = {"use_grouped_topk": False, "expert_group_num": 0, "topk_group": 0}


# The MoE path one device uses, and why: the chooser's own choice, as it comes
# (``vendor``: ``kunlun_ops.moe_ffn_block``).
MoeKernels = chooser.Choice[Callable[..., Any]]


def load_vendor() -> tuple[Callable[..., Any] | None, str]:
    """``kunlun_ops.moe_ffn_block``, or None and why not."""
    fn, why = vendor.function(VENDOR_MODULE, VENDOR_FUNCTION)
    return fn, (f"{why} is available" if fn is not None else why)


SEAM: chooser.DeviceSeam[Callable[..., Any], MoeKernels] = chooser.DeviceSeam(
    chooser.MOE, load_vendor, lambda c: c
)
select_kernels = SEAM.select  # the MoE path for tensors on a device, chosen once
reset = SEAM.reset
served = SEAM.served  # each path the MoE layers ran on here, with call counts


def record_served(device: torch.device, path: str, reason: str) -> None:
    """Count one MoE call served on ``path`` (``served()`` reports it); also used by
    vLLM's MoE layer (``fused_moe_method.py``)."""
    SEAM.record(device, path, reason)


def _vendor_refusal(
    local_experts: int, num_experts: int, quantized: bool
) -> str | None:
    """Why the vendor block cannot take this layer (None: it can)."""
    if quantized:
        return "int8 experts: moe_ffn_block takes no weight scales"
    if local_experts != num_experts:
        return (
            f"expert parallelism ({local_experts} of {num_experts} experts on this "
            "rank): moe_ffn_block routes over every expert it is given"
        )
    return None


def forward_eager(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    top_k: int,
    renormalize: bool,
    expert_start: int,
    num_experts: int,
    w13_scale: torch.Tensor | None,
    w2_scale: torch.Tensor | None,
) -> torch.Tensor:
    """The custom op's implementation: the routed block on the chosen path."""
    x2 = x.reshape(-1, x.shape[-1])
    kernels = select_kernels(x.device)
    path, reason = kernels.name, kernels.reason
    if kernels.vendor is not None:
        quantized = w13_scale is not None or w2_scale is not None
        refusal = _vendor_refusal(w13.shape[0], num_experts, quantized)
        if refusal is None:
            out = torch.empty_like(x2)
            kernels.vendor(
                x=x2.contiguous(),
                gate_w=router_weight.contiguous(),
                inter_w=w13.contiguous(),
                output_w=w2.contiguous(),
                expert_num=num_experts,
                moe_top_k=top_k,
                topk_group=UNGROUPED["topk_group"],
                renormalize=renormalize,
                use_grouped_topk=UNGROUPED["use_grouped_topk"],
                expert_group_num=UNGROUPED["expert_group_num"],
                out=out,
            )
            SEAM.record(x.device, VENDOR, reason)
            return out.reshape(x.shape)
        path, reason = PORTABLE, refusal
        logger.info_once(
            "vllm-kunlun: MoE layers on %s with %s run the portable kernel, not the "
            "vendor moe_ffn_block",
            x.device.type,
            refusal,
        )
    out = portable.moe_forward(
        x2,
        router_weight,
        w13,
        w2,
        top_k=top_k,
        renormalize=renormalize,
        expert_start=expert_start,
        w13_scale=w13_scale,
        w2_scale=w2_scale,
    )
    SEAM.record(x.device, path, reason)
    return out.reshape(x.shape)


# ---- one custom op for both paths ---------------------------------------------------

OP_NAMESPACE = NAMESPACE
OP_NAME = "moe_forward"
_SCHEMA = (
    "moe_forward(Tensor x, Tensor router_weight, Tensor w13, Tensor w2, int top_k, "
    "bool renormalize, int expert_start, int num_experts, Tensor? w13_scale, "
    "Tensor? w2_scale) -> Tensor"
)


def _fake(x: torch.Tensor, *weights_and_args: Any) -> torch.Tensor:
    return x.new_empty(x.shape)


_OP = PluginOp(_SCHEMA, forward_eager, _fake)


def register_op() -> Callable[..., torch.Tensor]:
    """Define ``torch.ops.vllm_kunlun.moe_forward`` once per process; returns it."""
    return _OP.get()


def moe_forward(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    *,
    top_k: int,
    renormalize: bool,
    expert_start: int = 0,
    num_experts: int | None = None,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The routed experts' output for ``x`` [T, H] (or [..., H]), in ``x``'s dtype.

    ``router_weight`` [E, H]; ``w13`` [E_local, 2I, H]; ``w2`` [E_local, H, I]; this
    rank holds experts ``expert_start ..`` of ``num_experts`` (default: all, E). The
    caller adds the shared expert and all-reduces over TP / EP. int8 experts: pass
    ``w13_scale`` [E_local, 2I] and ``w2_scale`` [E_local, H] (float32 channel scales).
    """
    op = register_op()
    return op(
        x,
        router_weight,
        w13,
        w2,
        top_k,
        renormalize,
        expert_start,
        router_weight.shape[0] if num_experts is None else num_experts,
        w13_scale,
        w2_scale,
    )
