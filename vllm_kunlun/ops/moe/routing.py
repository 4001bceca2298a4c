"""vLLM's MoE routing in plain torch: which experts each token runs, with what weight.

Why: vLLM 0.15.1's ``FusedMoE`` routes through ``router/`` classes whose default kernels
(``topk_softmax`` / ``topk_sigmoid``) live in ``vllm._C``, which does not load next to
the validated torch (host emulation or Kunlun); only the grouped top-k has a torch path.
The plugin's fused-MoE method (``ops/moe/fused_moe_method.py``) routes here instead.

Semantics: exactly what vLLM's ``router/router_factory.py`` picks, in its order
(docs/kernels.md, "vLLM's FusedMoE"):

1. grouped top-k (``use_grouped_topk``; DeepSeek-V3 / GLM-4.5 style): scores by
   softmax or sigmoid, plus ``e_score_correction_bias`` for the choice only (group
   score: sum of each group's two best, else the group's best), the ``topk_group``
   best groups kept, top-k inside them, weights taken from the unbiased scores,
   renormalised, times ``routed_scaling_factor``. When the experts cannot be split
   into ``num_expert_group`` groups vLLM falls back to the ungrouped routers below
   (with softmax scoring, as vLLM does);
2. a model's ``custom_routing_function`` (Llama 4 ...), called as vLLM calls it;
3. with ``e_score_correction_bias``: biased choice, unbiased weights, renormalised,
   times ``routed_scaling_factor``;
4. otherwise softmax (or sigmoid) top-k, renormalised when asked; vLLM applies no
   ``routed_scaling_factor`` here.

Scores are float32 whatever the logits' dtype; ties go as ``torch.topk`` breaks them.
Weights come back float32, ids int64 (global logical expert ids). Expert-parallel load
balancing (EPLB) remaps ids and is refused at engine start (``fused_moe_method.py``).
Removal: when vLLM's routers run on the validated torch without ``vllm._C``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch

SCORING_FUNCS = ("softmax", "sigmoid")


@dataclass(frozen=True)
class Routing:
    """A FusedMoE layer's routing settings (the attributes vLLM's layer carries)."""

    top_k: int
    renormalize: bool = True
    use_grouped_topk: bool = False
    num_expert_group: int | None = None
    topk_group: int | None = None
    scoring_func: str = "softmax"
    routed_scaling_factor: float = 1.0
    custom_routing_function: Callable[..., Any] | None = None

    @classmethod
    def of_layer(cls, layer: Any) -> Routing:
        """The settings of a vLLM ``FusedMoE`` layer: each field is the layer's
        attribute of the same name."""
        return cls(**{f.name: getattr(layer, f.name) for f in fields(cls)})

    def kind(self, has_bias: bool) -> str:
        """Which of vLLM's routers these settings select (for logs and refusals)."""
        if self.use_grouped_topk:
            return "grouped_topk"
        if self.custom_routing_function is not None:
            return "custom"
        return "topk_bias" if has_bias else "topk"


def _scores(logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    logits = logits.float()
    if scoring_func == "softmax":
        return torch.softmax(logits, dim=-1)
    if scoring_func == "sigmoid":
        return logits.sigmoid()
    raise ValueError(
        f"MoE scoring function {scoring_func!r} is not one vLLM defines "
        f"({', '.join(SCORING_FUNCS)})"
    )


def _normalise(weights: torch.Tensor, renormalize: bool) -> torch.Tensor:
    return weights / weights.sum(dim=-1, keepdim=True) if renormalize else weights


def topk(
    logits: torch.Tensor, top_k: int, renormalize: bool, scoring_func: str = "softmax"
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's ``fused_topk``: top-k of the scores, renormalised when asked."""
    weights, ids = torch.topk(_scores(logits, scoring_func), top_k, dim=-1)
    return _normalise(weights, renormalize), ids


def topk_bias(
    logits: torch.Tensor,
    bias: torch.Tensor,
    top_k: int,
    renormalize: bool,
    scoring_func: str = "softmax",
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's ``fused_topk_bias``: chosen on ``scores + bias``, weighted by ``scores``."""
    scores = _scores(logits, scoring_func)
    ids = torch.topk(scores + bias.float().unsqueeze(0), top_k, dim=-1)[1]
    return _normalise(scores.gather(1, ids), renormalize), ids


def grouped_topk(
    logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    num_expert_group: int,
    topk_group: int,
    scoring_func: str = "softmax",
    routed_scaling_factor: float = 1.0,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's ``grouped_topk`` (DeepSeek-V3's group-limited routing)."""
    scores = _scores(logits, scoring_func)
    tokens, experts = scores.shape
    choice = scores if bias is None else scores + bias.float().unsqueeze(0)
    grouped = choice.view(tokens, num_expert_group, -1)
    if bias is None:
        group_scores = grouped.max(dim=-1).values
    else:
        group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
    groups = torch.topk(group_scores, topk_group, dim=-1)[1]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
    keep = keep.unsqueeze(-1).expand(-1, -1, experts // num_expert_group)
    masked = choice.masked_fill(~keep.reshape(tokens, experts), float("-inf"))
    ids = torch.topk(masked, top_k, dim=-1)[1]
    weights = _normalise(scores.gather(1, ids), renormalize)
    if routed_scaling_factor != 1.0:
        weights = weights * routed_scaling_factor
    return weights, ids


def select_experts(
    hidden_states: torch.Tensor,
    router_logits: torch.Tensor,
    routing: Routing,
    e_score_correction_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 weights [T, k], int64 global expert ids [T, k]) as vLLM routes them."""
    r = routing
    bias = e_score_correction_bias
    if r.use_grouped_topk:
        if r.num_expert_group is None or r.topk_group is None:
            raise ValueError(
                "grouped top-k routing needs num_expert_group and topk_group"
            )
        experts = router_logits.shape[-1]
        if experts > r.num_expert_group and experts % r.num_expert_group == 0:
            weights, ids = grouped_topk(
                router_logits,
                r.top_k,
                r.renormalize,
                r.num_expert_group,
                r.topk_group,
                r.scoring_func,
                r.routed_scaling_factor,
                bias,
            )
        elif bias is not None:  # vLLM's fallback keeps softmax scoring here
            weights, ids = topk_bias(router_logits, bias, r.top_k, r.renormalize)
            weights = weights * r.routed_scaling_factor
        else:
            weights, ids = topk(router_logits, r.top_k, r.renormalize)
    elif r.custom_routing_function is not None:
        weights, ids = r.custom_routing_function(
            hidden_states=hidden_states,
            gating_output=router_logits,
            topk=r.top_k,
            renormalize=r.renormalize,
        )
    elif bias is not None:
        weights, ids = topk_bias(
            router_logits, bias, r.top_k, r.renormalize, r.scoring_func
        )
        if r.routed_scaling_factor != 1.0:
            weights = weights * r.routed_scaling_factor
    else:
        weights, ids = topk(router_logits, r.top_k, r.renormalize, r.scoring_func)
    return weights.to(torch.float32), ids.to(torch.int64)
