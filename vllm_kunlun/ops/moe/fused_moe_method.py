"""vLLM's own ``FusedMoE`` / ``SharedFusedMoE`` layers served on vllm-kunlun platforms.

Why: vLLM 0.15.1 takes its CPU MoE path only when ``is_cpu()`` / ``is_xpu()``; on an
out-of-tree platform (Kunlun, host emulation) ``UnquantizedFusedMoEMethod`` takes the
CUDA path, whose routing (``vllm._C`` ``topk_softmax``) and experts (a Triton modular
kernel never built for this platform) do not run. Every model vLLM builds on its MoE
layer (Qwen3-MoE, Mixtral, GLM-4.5, Qwen3-Next, ...) died about a minute into the start.

How, through vLLM's extension points only (``CustomOp.register_oot``):
- ``UnquantizedFusedMoEMethod`` (CustomOp ``unquantized_fused_moe``) is replaced by
  ``KunlunUnquantizedFusedMoEMethod``: a *monolithic* method (the layer hands it the
  router logits, as it does vLLM's CPU method), which routes as vLLM defines it
  (``ops/moe/routing.py``; on Kunlun's routing kernels where the policy wants vendor
  kernels and one computes it, ``routing_vendor.py``) and runs the experts on the
  plugin's grouped-expert kernel (``ops/moe/portable.py``; the only loop is over the
  experts some token chose);
- ``FusedMoE`` and ``SharedFusedMoE`` are replaced by subclasses that check, right
  after vLLM built the layer, that the plugin serves it: vLLM's compressed-tensors
  W8A8-INT8 method gets the plugin's forward (``KunlunW8A8Int8MoEMethod``: the grouped
  kernel with each matmul on the int8 seam; vLLM's weights and loaders kept), and
  anything else is refused (``refusal``): an MoE variant
  that is not served (quantized experts other than the plugin's methods, an activation
  the kernel lacks, EPLB, data parallel dispatch) stops the engine start naming the
  layer, the cause and the fix, instead of a raw kernel error a minute in.

Expert parallelism: vLLM gives each rank ``local_num_experts`` and an ``expert_map``
(global id -> local id, -1 elsewhere); the kernel runs this rank's pairs and the layer
all-reduces (vLLM's own ``reduce_results``). Tensor parallelism splits each expert's
intermediate width; nothing here depends on it.

Registered by ``register_all`` in every model process of a vllm-kunlun platform
(registry entry ``kunlun_fused_moe``). Removal: when vLLM's fused MoE runs on the
validated torch for out-of-tree platforms.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from vllm.model_executor.layers.fused_moe.layer import FusedMoE
from vllm.model_executor.layers.fused_moe.shared_fused_moe import SharedFusedMoE
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
    UnquantizedFusedMoEMethod,
)
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
    CompressedTensorsW8A8Int8MoEMethod,
)

from vllm_kunlun.logger import init_logger
from vllm_kunlun.ops.active_platform import active_plugin_platform
from vllm_kunlun.ops.moe import portable, routing, routing_vendor, seam

logger = init_logger(__name__)

# The served report's path: the grouped-expert kernel, routed portably or by the vendor.
PATHS = {"portable": "portable", "vendor": "vendor routing, portable experts"}
REASON = "vLLM FusedMoE on the plugin's grouped-expert kernel"


def _gelu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate) * up


def _swigluoai_and_mul(
    gate_up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0
) -> torch.Tensor:
    """gpt-oss's clamped SwiGLU on interleaved (gate, up) columns, as vLLM's
    ``SwigluOAIAndMul.forward_native``."""
    gate = gate_up[..., ::2].clamp(max=limit)
    up = gate_up[..., 1::2].clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


# vLLM's gated MoE activations (fused_moe/utils.py apply_moe_activation) the kernel runs.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": portable.silu_and_mul,
    "gelu": _gelu_and_mul,
    "swigluoai": _swigluoai_and_mul,
}


def _local_ids(ids: torch.Tensor, expert_map: torch.Tensor | None) -> torch.Tensor:
    """Global expert ids -> this rank's local ids (-1: another rank's expert)."""
    if expert_map is None:
        return ids
    return expert_map.to(torch.int64)[ids]


def experts_forward(
    layer: Any,
    x: torch.Tensor,
    router_logits: torch.Tensor,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The routed experts of a vLLM ``FusedMoE`` ``layer`` for ``x`` [T, H]: vLLM's
    routing, this rank's experts on the grouped kernel (int8 with the scales)."""
    (weights, ids), route = routing_vendor.select_experts(
        x, router_logits, routing.Routing.of_layer(layer), layer.e_score_correction_bias
    )
    out = portable.grouped_experts(
        x,
        layer.w13_weight,
        layer.w2_weight,
        weights,
        _local_ids(ids, layer.expert_map),
        w13_scale=w13_scale,
        w2_scale=w2_scale,
        act=ACTIVATIONS[layer.activation],
        w13_bias=getattr(layer, "w13_bias", None),
        w2_bias=getattr(layer, "w2_bias", None),
        weight_on_input=layer.apply_router_weight_on_input,
    )
    seam.record_served(x.device, PATHS[route], REASON)
    return out


class _Monolithic:
    """What both served methods say to vLLM's layer: the whole block is one call
    (``apply_monolithic``), and there is no all2all modular kernel (data-parallel
    dispatch is refused at start)."""

    @property
    def is_monolithic(self) -> bool:
        return True

    def maybe_make_prepare_finalize(self, routing_tables: Any = None) -> None:
        return None


class KunlunUnquantizedFusedMoEMethod(_Monolithic, UnquantizedFusedMoEMethod):
    """vLLM's unquantized MoE method, monolithic on the plugin's kernels."""

    def apply_monolithic(  # type: ignore[override]
        self, layer: Any, x: torch.Tensor, router_logits: torch.Tensor
    ) -> torch.Tensor:
        return experts_forward(layer, x, router_logits)

    def forward_oot(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError(
            "KunlunUnquantizedFusedMoEMethod is monolithic: FusedMoE calls "
            "apply_monolithic, never the non-monolithic apply"
        )


class KunlunW8A8Int8MoEMethod(_Monolithic, CompressedTensorsW8A8Int8MoEMethod):
    """vLLM's compressed-tensors W8A8-INT8 MoE method (int8 experts, per-channel
    weight scales, dynamic per-token activations), monolithic on the grouped kernel
    whose matmuls run on the plugin's int8 path (``ops/int8``, vendor where chosen).
    vLLM's weights and loaders are kept: only the forward changes."""

    @classmethod
    def serving(cls, method: CompressedTensorsW8A8Int8MoEMethod) -> Any:
        """The same method (its state and the layer's int8 parameters), served."""
        ours = cls.__new__(cls)
        ours.__dict__.update(method.__dict__)
        return ours

    def apply_monolithic(  # type: ignore[override]
        self, layer: Any, x: torch.Tensor, router_logits: torch.Tensor
    ) -> torch.Tensor:
        return experts_forward(
            layer,
            x,
            router_logits,
            w13_scale=layer.w13_weight_scale,
            w2_scale=layer.w2_weight_scale,
        )


# vLLM's method classes the plugin serves with its own (exact type: a subclass of
# vLLM's may change what its weights mean).
SERVING = {CompressedTensorsW8A8Int8MoEMethod: KunlunW8A8Int8MoEMethod.serving}
# Methods whose layers the plugin serves.
SERVED_METHODS: list[type] = [KunlunUnquantizedFusedMoEMethod, KunlunW8A8Int8MoEMethod]


def refusal(layer: Any) -> str | None:
    """Why the plugin cannot serve this vLLM MoE layer (None: it can)."""
    method = layer.quant_method
    if not isinstance(method, tuple(SERVED_METHODS)):
        quant = type(layer.quant_config).__name__ if layer.quant_config else "none"
        return (
            f"its experts use {type(method).__name__} (quantization config {quant}); "
            "vllm-kunlun serves float experts and compressed-tensors W8A8-INT8 "
            "experts only. Serve a float (bf16/fp16) or W8A8-INT8 checkpoint of "
            "this model"
        )
    if layer.activation not in ACTIVATIONS:
        return (
            f"its expert activation {layer.activation!r} is not one the plugin's "
            f"MoE kernel runs ({', '.join(ACTIVATIONS)})"
        )
    if layer.enable_eplb:
        return (
            "expert-parallel load balancing (EPLB) remaps experts at run time, which "
            "the plugin's MoE kernel does not follow. Serve without --enable-eplb"
        )
    if layer.dp_size > 1:
        return (
            f"data parallel size {layer.dp_size}: the MoE dispatch/combine over "
            "data-parallel ranks is not served. Use tensor parallelism (with "
            "--enable-expert-parallel for expert parallelism) instead"
        )
    if layer.pcp_size > 1:
        return "prefill context parallelism is not served for MoE layers"
    return None


def serve(layer: Any) -> None:
    """Give ``layer`` the plugin's forward for a vLLM method it serves, then refuse
    the layer if it is still not served."""
    make = SERVING.get(type(layer.quant_method))
    if make is not None:
        layer.quant_method = make(layer.quant_method)
    check_layer(layer)


def check_layer(layer: Any) -> None:
    why = refusal(layer)
    if why is not None:
        raise ValueError(
            f"vllm-kunlun cannot serve the MoE layer {layer.layer_name!r} "
            f"({type(layer).__bases__[0].__name__}): {why}."
        )
    logger.info_once(
        "vllm-kunlun: vLLM's MoE layers (%s) served: %s",
        type(layer.quant_method).__name__,
        REASON,
    )


class KunlunFusedMoE(FusedMoE):
    """vLLM's ``FusedMoE``, refused at construction when the plugin cannot serve it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        serve(self)


class KunlunSharedFusedMoE(SharedFusedMoE):
    """vLLM's ``SharedFusedMoE`` (routed + shared experts), checked the same way."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        serve(self)


# (vLLM class name, its module, ours): every replacement registered together.
REPLACEMENTS: tuple[tuple[str, str, type], ...] = (
    (
        "UnquantizedFusedMoEMethod",
        "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method",
        KunlunUnquantizedFusedMoEMethod,
    ),
    ("FusedMoE", "vllm.model_executor.layers.fused_moe.layer", KunlunFusedMoE),
    (
        "SharedFusedMoE",
        "vllm.model_executor.layers.fused_moe.shared_fused_moe",
        KunlunSharedFusedMoE,
    ),
)


def register_all() -> list[str]:
    """Register the replacements not yet registered; the names registered now.

    Deferred (returns []) while vLLM is still resolving its platform. Unlike the
    vendor CustomOps this runs on every vllm-kunlun platform: without it no MoE
    layer runs at all. A class someone else already replaced is kept, with a warning.
    """
    from vllm.model_executor.custom_op import CustomOp, op_registry_oot

    from vllm_kunlun.patching.attribute import platform_resolved

    if not platform_resolved():
        return []
    if active_plugin_platform() is None:  # CUDA, CPU ...: vLLM's own MoE serves
        return []
    done = []
    for name, module, ours in REPLACEMENTS:
        current = op_registry_oot.get(name)
        if current is ours:
            continue
        if current is not None:
            logger.warning_once(
                "vllm-kunlun: %s is already replaced by %s.%s; keeping it",
                name,
                current.__module__,
                current.__qualname__,
            )
            continue
        upstream = getattr(importlib.import_module(module), name)
        CustomOp.register_oot(ours, name=name)
        # vLLM's op name, so custom_ops switches keep meaning what they say.
        ours.name = upstream.name  # type: ignore[attr-defined]
        done.append(name)
    if done:
        logger.info("vllm-kunlun: vLLM's MoE layers served by the plugin: %s", done)
    return done


def unregister_all() -> None:
    """Undo ``register_all`` (tests); someone else's replacements stay."""
    from vllm.model_executor.custom_op import op_registry_oot

    for name, _, ours in REPLACEMENTS:
        if op_registry_oot.get(name) is ours:
            del op_registry_oot[name]


RUNTIME_PATCHES = {"kunlun_fused_moe": lambda phase: bool(register_all())}
