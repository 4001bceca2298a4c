"""Qwen3.5-MoE (Gated DeltaNet + gated attention, a routed MoE in every layer), text path.

Why: most Qwen3.5 checkpoints are mixture-of-experts hybrids
(``Qwen3_5MoeForConditionalGeneration``, ``model_type`` ``qwen3_5_moe``: 35B-A3B,
122B-A10B, 397B-A17B). vLLM 0.15.1 has no Qwen3.5 model, and its own MoE layer
(``FusedMoE``) runs on Triton or ``vllm._C`` kernels that our platforms lack.

How: the dense hybrid (``models/qwen3_5.py``) with this module's sparse block in place
of the MLP. The block is the reference's (transformers 5.2.0
``models/qwen3_5_moe/modeling_qwen3_5_moe.py``, ``Qwen3_5MoeSparseMoeBlock``):
router softmax in float32, top-k, renormalised (Qwen3.5-MoE always renormalises; a
config's ``norm_topk_prob: false`` is honoured), the routed experts (SiLU-gated), and a
shared expert scaled by ``sigmoid(shared_expert_gate(x))``. The routed experts run
behind ``ops/moe/seam.py`` (the vendor block or the portable grouped-expert kernel,
chosen by ``ops/chooser.py``); the shared expert and the projections are vLLM linears.

Parallelism: tensor parallel splits each expert's intermediate width over the ranks
(like the dense MLP); ``--enable-expert-parallel`` gives each rank whole experts
instead (``num_experts / tp`` of them). Either way each rank's output is a partial sum
and one all-reduce per layer adds routed and shared parts together.

Weights, both layouts transformers reads: per expert (``mlp.experts.<e>.gate_proj`` /
``up_proj`` / ``down_proj``, what released and compressed-tensors checkpoints hold) and
fused (``mlp.experts.gate_up_proj`` ``[E, 2I, H]``, ``mlp.experts.down_proj``
``[E, H, I]``, transformers' in-memory layout). W8A8-INT8 experts (int8 weights with a
per-channel ``weight_scale``, dynamic per-token activations) go through the int8 seam;
the router and the shared-expert gate stay float, as real checkpoints ``ignore`` them.
A missing expert tensor, an expert index beyond ``num_experts`` or a wrong shape is an
error naming the tensor.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.models.qwen2_moe import Qwen2MoeMLP
from vllm.model_executor.models.utils import is_pp_missing_parameter
from vllm.model_executor.utils import set_weight_attrs

from vllm_kunlun.logger import init_logger
from vllm_kunlun.models.qwen3_5 import Qwen3_5ForCausalLM, TextWeightLoading
from vllm_kunlun.models.qwen3_5_config import text_config
from vllm_kunlun.ops.moe.seam import moe_forward, register_op

logger = init_logger(__name__)

# ".mlp.experts.<e>.<proj>.<weight|weight_scale>" or ".mlp.experts.<gate_up|down>_proj"
_PER_EXPERT = re.compile(
    r"(?P<block>.*\.mlp)\.experts\.(?P<expert>\d+)\."
    r"(?P<proj>gate_proj|up_proj|down_proj)\.(?P<kind>weight|weight_scale)$"
)
_FUSED = re.compile(r"(?P<block>.*\.mlp)\.experts\.(?P<proj>gate_up_proj|down_proj)$")
_PROJS = ("gate_proj", "up_proj", "down_proj")


def expert_parallel(vllm_config: VllmConfig) -> bool:
    return bool(getattr(vllm_config.parallel_config, "enable_expert_parallel", False))


def int8_experts(vllm_config: VllmConfig, prefix: str) -> bool:
    """Whether this block's experts are W8A8-INT8 in the checkpoint (else float).

    The experts are not vLLM linear layers, so the quantization config is asked here:
    compressed-tensors' ``ignore`` decides, and the one scheme the platform serves for
    experts is int8 per-channel weights with dynamic per-token activations.
    """
    quant = vllm_config.quant_config
    if quant is None:
        return False
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )
    from vllm.model_executor.layers.quantization.compressed_tensors.utils import (
        should_ignore_layer,
    )

    if not isinstance(quant, CompressedTensorsConfig):
        raise ValueError(
            f"Qwen3.5-MoE experts: quantization {quant.get_name()} is not served; "
            "serve the unquantized checkpoint or a compressed-tensors W8A8-INT8 one"
        )
    name = f"{prefix}.experts.0.gate_proj"
    if should_ignore_layer(
        name, ignore=quant.ignore, fused_mapping=quant.packed_modules_mapping
    ):
        return False
    group = quant.target_scheme_map.get("Linear")
    weights = None if group is None else group.get("weights")
    inputs = None if group is None else group.get("input_activations")
    ok = (
        weights is not None
        and inputs is not None
        and weights.num_bits == 8
        and getattr(weights.strategy, "value", weights.strategy) == "channel"
        and weights.symmetric
        and inputs.dynamic
        and inputs.symmetric
        and getattr(inputs.strategy, "value", inputs.strategy) == "token"
    )
    if not ok:
        raise ValueError(
            "Qwen3.5-MoE experts: vllm-kunlun serves W8A8-INT8 experts with 8-bit "
            "symmetric per-channel weights and dynamic per-token activations only; "
            f"this checkpoint's 'Linear' scheme is weights {weights}, activations "
            f"{inputs}. Serve such a checkpoint, or list the experts in the "
            "quantization config's ignore to keep them float."
        )
    return True


class Qwen3_5MoeExperts(nn.Module):
    """The routed experts of one layer as stacked tensors: ``w13`` (gate rows, then up
    rows, each this rank's slice) ``[E_local, 2 * I_local, H]`` and ``w2``
    ``[E_local, H, I_local]``; int8 with per-output-channel float32 scales when the
    checkpoint quantizes them."""

    def __init__(self, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        config = text_config(vllm_config)
        self.prefix = prefix
        self.num_experts = int(config.num_experts)
        self.top_k = int(config.num_experts_per_tok)
        self.renormalize = bool(getattr(config, "norm_topk_prob", True))
        self.hidden_size = int(config.hidden_size)
        self.intermediate_size = int(config.moe_intermediate_size)
        tp, rank = (
            get_tensor_model_parallel_world_size(),
            get_tensor_model_parallel_rank(),
        )
        self.tp_size, self.tp_rank = tp, rank
        if expert_parallel(vllm_config):
            self.local_experts = self.num_experts // tp
            self.expert_start = rank * self.local_experts
            self.local_intermediate = self.intermediate_size
            self.inter_start = 0
        else:
            self.local_experts = self.num_experts
            self.expert_start = 0
            self.local_intermediate = self.intermediate_size // tp
            self.inter_start = rank * self.local_intermediate
        self.quantized = int8_experts(vllm_config, prefix)
        e, i, h = self.local_experts, self.local_intermediate, self.hidden_size
        dtype = torch.int8 if self.quantized else vllm_config.model_config.dtype
        self.w13 = nn.Parameter(torch.empty(e, 2 * i, h, dtype=dtype), False)
        self.w2 = nn.Parameter(torch.empty(e, h, i, dtype=dtype), False)
        params = [self.w13, self.w2]
        self.w13_scale: nn.Parameter | None = None
        self.w2_scale: nn.Parameter | None = None
        if self.quantized:
            self.w13_scale = nn.Parameter(torch.empty(e, 2 * i), False)
            self.w2_scale = nn.Parameter(torch.empty(e, h), False)
            params += [self.w13_scale, self.w2_scale]
        for param in params:
            set_weight_attrs(param, {"weight_loader": self.load_expert})
        # (global expert, projection, kind) of every tensor this rank must load.
        self._expected = {
            (x, proj, kind)
            for x in range(self.expert_start, self.expert_start + self.local_experts)
            for proj in _PROJS
            for kind in (("weight", "weight_scale") if self.quantized else ("weight",))
        }
        self._loaded: set[tuple[int, str, str]] = set()
        register_op()  # before torch.compile traces the model

    # ---- loading --------------------------------------------------------------------
    def is_local(self, expert: int) -> bool:
        return self.expert_start <= expert < self.expert_start + self.local_experts

    def load_expert(
        self, param: torch.Tensor, tensor: torch.Tensor, shard: tuple[Any, ...]
    ) -> None:
        """Copy one checkpoint tensor into its slot: ``shard`` is ``(disk name,
        expert, projection, kind)``; the shape is checked against the config first."""
        disk_name, expert, proj, kind = shard
        h, inter = self.hidden_size, self.intermediate_size
        full = (h, inter) if proj == "down_proj" else (inter, h)
        want = full if kind == "weight" else (full[0], 1)
        if tuple(tensor.shape) != want and not (
            kind == "weight_scale" and tuple(tensor.shape) == (full[0],)
        ):
            raise ValueError(
                f"checkpoint tensor {disk_name!r} has shape {list(tensor.shape)}; "
                f"this config (hidden_size {h}, moe_intermediate_size {inter}) needs "
                f"{list(want)}. Re-export the checkpoint or fix config.json."
            )
        if kind == "weight" and self.quantized and tensor.dtype != torch.int8:
            raise ValueError(
                f"checkpoint tensor {disk_name!r} is {tensor.dtype}, but the "
                "quantization config makes this expert int8 (W8A8); the checkpoint "
                "and its quantization_config disagree"
            )
        local = expert - self.expert_start
        i0, i = self.inter_start, self.local_intermediate
        if kind == "weight_scale":
            tensor = tensor.reshape(-1)
        if proj == "down_proj":
            src = tensor if kind == "weight_scale" else tensor[:, i0 : i0 + i]
            dst = (self.w2_scale if kind == "weight_scale" else self.w2)[local]  # type: ignore[index]
        else:
            rows = slice(0, i) if proj == "gate_proj" else slice(i, 2 * i)
            src = tensor[i0 : i0 + i]
            target = self.w13_scale if kind == "weight_scale" else self.w13
            dst = target[local][rows]  # type: ignore[index]
        dst.copy_(src.to(dst.dtype))
        self._loaded.add((expert, proj, kind))

    def missing(self) -> list[str]:
        """The checkpoint names of the expert tensors this rank never received."""
        return [
            f"{self.prefix}.experts.{x}.{proj}.{kind}"
            for x, proj, kind in sorted(self._expected - self._loaded)
        ]

    # ---- forward --------------------------------------------------------------------
    def forward(self, x: torch.Tensor, router_weight: torch.Tensor) -> torch.Tensor:
        return moe_forward(
            x,
            router_weight,
            self.w13,
            self.w2,
            top_k=self.top_k,
            renormalize=self.renormalize,
            expert_start=self.expert_start,
            num_experts=self.num_experts,
            w13_scale=self.w13_scale,
            w2_scale=self.w2_scale,
        )


class Qwen3_5MoeSparseBlock(nn.Module):
    """Router, routed experts, shared expert and its gate; one all-reduce."""

    def __init__(self, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        config = text_config(vllm_config)
        hidden = int(config.hidden_size)
        self.tp_size = get_tensor_model_parallel_world_size()
        # The router and the shared-expert gate are never quantized (real W8A8
        # checkpoints ignore them); a checkpoint that quantizes them is refused at
        # loading (its weight_scale has no place).
        self.gate = ReplicatedLinear(
            hidden,
            int(config.num_experts),
            bias=False,
            quant_config=None,
            prefix=f"{prefix}.gate",
        )
        self.experts = Qwen3_5MoeExperts(vllm_config, prefix=prefix)
        self.shared_expert = Qwen2MoeMLP(
            hidden_size=hidden,
            intermediate_size=int(config.shared_expert_intermediate_size),
            hidden_act=config.hidden_act,
            quant_config=vllm_config.quant_config,
            reduce_results=False,
            prefix=f"{prefix}.shared_expert",
        )
        self.shared_expert_gate = ReplicatedLinear(
            hidden,
            1,
            bias=False,
            quant_config=None,
            prefix=f"{prefix}.shared_expert_gate",
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shared = self.shared_expert(hidden_states)
        gate, _ = self.shared_expert_gate(hidden_states)
        shared = torch.sigmoid(gate) * shared
        routed = self.experts(hidden_states, self.gate.weight)
        out = routed + shared
        if self.tp_size > 1:
            out = tensor_model_parallel_all_reduce(out)
        return out


class MoeWeightLoading(TextWeightLoading):
    """The text loader plus the routed experts (shared with the MoE MTP draft)."""

    config: Any

    if TYPE_CHECKING:

        def named_modules(self) -> Iterable[tuple[str, nn.Module]]: ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        experts = {
            name: module
            for name, module in self.named_modules()
            if isinstance(module, Qwen3_5MoeExperts)
        }
        routed: set[str] = set()

        def others() -> Iterable[tuple[str, torch.Tensor]]:
            """Everything but the text model's routed experts, for the dense loader
            (which also skips, and counts, the vision tower and the MTP head)."""
            for disk_name, tensor in weights:
                if ".mlp.experts." not in disk_name:
                    yield disk_name, tensor
                    continue
                name = self._checkpoint_name(disk_name)
                if name is None:  # skipped (and counted)
                    continue
                routed.update(
                    self._load_expert(disk_name, name, tensor, experts, params)
                )

        self._skipped = {}
        loaded = super().load_weights(others())
        missing = [m for module in experts.values() for m in module.missing()]
        if missing:
            more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
            raise ValueError(
                f"the checkpoint lacks expert tensors: {', '.join(missing[:5])}{more}; "
                f"this config has {self.config.num_experts} experts per layer. "
                "Re-export the checkpoint or fix num_experts in config.json."
            )
        return loaded | routed

    def _load_expert(
        self,
        disk_name: str,
        name: str,
        tensor: torch.Tensor,
        experts: dict[str, Qwen3_5MoeExperts],
        params: dict[str, nn.Parameter],
    ) -> set[str]:
        if is_pp_missing_parameter(name, self):  # type: ignore[arg-type]
            self._skip("other pipeline stages")
            return set()
        per = _PER_EXPERT.match(name)
        fused = None if per else _FUSED.match(name)
        match = per or fused
        module = None if match is None else experts.get(match["block"] + ".experts")
        if match is None or module is None:
            raise ValueError(
                f"checkpoint tensor {disk_name!r} has no place in "
                f"{type(self).__name__}: expert tensors are "
                "'<layer>.mlp.experts.<e>.(gate|up|down)_proj.weight[_scale]' or "
                "'<layer>.mlp.experts.(gate_up|down)_proj'"
            )
        prefix = match["block"] + ".experts."
        if per is not None:
            expert = int(per["expert"])
            if expert >= module.num_experts:
                raise ValueError(
                    f"checkpoint tensor {disk_name!r} is expert {expert}, but the "
                    f"config has num_experts={module.num_experts} (experts 0.."
                    f"{module.num_experts - 1}); the checkpoint and config.json "
                    "disagree"
                )
            if not module.is_local(expert):
                return set()  # expert parallel: another rank's expert
            proj, kind = per["proj"], per["kind"]
            if kind == "weight_scale" and not module.quantized:
                raise ValueError(
                    f"checkpoint tensor {disk_name!r} is a quantization scale, but "
                    "the quantization config leaves this layer's experts float"
                )
            target = "w2" if proj == "down_proj" else "w13"
            param_name = prefix + (
                target + "_scale" if kind == "weight_scale" else target
            )
            param = params[param_name]
            param.weight_loader(param, tensor, (disk_name, expert, proj, kind))  # type: ignore[attr-defined]
            return {param_name}
        # Fused [E, 2I, H] / [E, H, I]: split per expert through the same loader.
        if module.quantized:
            raise ValueError(
                f"checkpoint tensor {disk_name!r}: fused expert tensors are read as "
                "float, but the quantization config makes these experts int8"
            )
        e = module.num_experts
        lead = tuple(tensor.shape[:1])
        if tensor.dim() != 3 or lead != (e,):
            raise ValueError(
                f"checkpoint tensor {disk_name!r} has shape {list(tensor.shape)}; "
                f"a fused expert tensor holds num_experts={e} experts first"
            )
        param_name = prefix + ("w2" if fused["proj"] == "down_proj" else "w13")  # type: ignore[index]
        param = params[param_name]
        for expert in range(
            module.expert_start, module.expert_start + module.local_experts
        ):
            if fused["proj"] == "down_proj":  # type: ignore[index]
                parts = [("down_proj", tensor[expert])]
            else:
                gate, up = tensor[expert].chunk(2, dim=0)
                parts = [("gate_proj", gate), ("up_proj", up)]
            for proj, part in parts:
                param.weight_loader(param, part, (disk_name, expert, proj, "weight"))  # type: ignore[attr-defined]
        return {param_name}


class Qwen3_5MoeForCausalLM(MoeWeightLoading, Qwen3_5ForCausalLM):
    """``Qwen3_5MoeForCausalLM`` checkpoints: weights ``model.*`` and ``lm_head.*``."""

    moe = True
    sparse_block = Qwen3_5MoeSparseBlock


class Qwen3_5MoeForConditionalGeneration(Qwen3_5MoeForCausalLM):
    """The MoE composite on its text path (weights ``model.language_model.*``; the
    vision tower's skipped), registered where torchvision is missing
    (``models/__init__.py``); with it, ``qwen3_5_vl.Qwen3_5MoeForConditionalGeneration``
    serves images too."""

    _text_prefix = "model.language_model."
