"""A deterministic tiny Qwen3.5-MoE checkpoint: the tiny hybrid with a routed MoE.

Why: Qwen3.5-MoE (``qwen3_5_moe``: 35B-A3B and up) needs a checkpoint that vLLM loads
through its normal path and transformers 5.2.0 runs as the reference, without a
download. Same hybrid stack and layouts as ``tiny_qwen3_5`` (causal
``Qwen3_5MoeForCausalLM``, composite ``Qwen3_5MoeForConditionalGeneration``); each
layer's MLP is a sparse block as released checkpoints store it: a router
(``mlp.gate``), per-expert projections (``mlp.experts.<e>.gate_proj`` / ``up_proj`` /
``down_proj``), a shared expert and its gate (``mlp.shared_expert_gate``).

Eight experts, two per token: the router is wide enough (std 3 logits) that each token
prefers a few experts clearly, so float noise does not flip an expert choice, while
different tokens reach different experts (a routing bug changes the output). Every
expert has its own weights and the shared expert is gated per token, so a kernel that
mixes up experts, weights or the gate is seen in the greedy tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec

ARCHITECTURES = {
    "causal": "Qwen3_5MoeForCausalLM",
    "composite": "Qwen3_5MoeForConditionalGeneration",
}


@dataclass(frozen=True)
class TinyQwen3_5MoeSpec(TinyQwen3_5Spec):
    """The tiny hybrid's shape plus its experts."""

    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 32
    shared_expert_intermediate_size: int = 64
    router_std: float = 3.0

    model_type = "qwen3_5_moe"

    @property
    def architecture(self) -> str:
        return ARCHITECTURES[self.layout]

    def text_fields(self) -> dict:
        return {
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "shared_expert_intermediate_size": self.shared_expert_intermediate_size,
            "router_aux_loss_coef": 0.001,
        }

    def mlp_weights(self, prefix: str, linear: Any) -> dict:
        h, i, s = (
            self.hidden_size,
            self.moe_intermediate_size,
            self.shared_expert_intermediate_size,
        )
        # linear(out, in, gain) has std gain / sqrt(in): router logits of std ~3.
        w = {prefix + "gate.weight": linear(self.num_experts, h, self.router_std)}
        for e in range(self.num_experts):
            x = f"{prefix}experts.{e}."
            w[x + "gate_proj.weight"] = linear(i, h)
            w[x + "up_proj.weight"] = linear(i, h)
            # sqrt(k): k experts' outputs add up to one MLP's scale.
            w[x + "down_proj.weight"] = linear(h, i, math.sqrt(2.0))
        w[prefix + "shared_expert.gate_proj.weight"] = linear(s, h)
        w[prefix + "shared_expert.up_proj.weight"] = linear(s, h)
        w[prefix + "shared_expert.down_proj.weight"] = linear(h, s)
        w[prefix + "shared_expert_gate.weight"] = linear(1, h, 2.0)
        return w
