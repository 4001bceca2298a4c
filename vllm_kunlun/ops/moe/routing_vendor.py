"""vLLM's MoE routing on Kunlun's routing kernels, where one computes it.

Why: a FusedMoE layer routes every token at every step; on Kunlun the vendor library
has one kernel for softmax top-k with renormalisation (``moe_softmax_topk_norm``) and
one for DeepSeek-V3 / GLM-4.5's sigmoid grouped top-k with the correction bias
(``moe_sigmoid_group_topk_norm``), where the portable router is a dozen torch kernels.

Vendor calls (declared in ``ops/contract.py``; call forms in ``docs/vendor-calls.md``),
by keyword as the upstream Kunlun plugin passes them, outputs preallocated (float32
weights, int32 ids), ``block_statistic`` / ``block_static`` None (upstream's value when
it does not need the per-block expert counts):

- ``moe_softmax_topk_norm(x=logits, normed_score=, topk_index=, block_statistic=None,
  stable=False)``: softmax (float32) top-k, renormalised. Serves vLLM's ``topk`` router
  with ``renormalize`` and softmax scoring;
- ``moe_sigmoid_group_topk_norm(x=logits, norm_score=, topk_index=, block_static=None,
  bias=, scale=1.0, n_group=, topk_group=)``: sigmoid scores, groups ranked by their two
  best biased scores, top-k of the biased scores in the kept groups, unbiased weights
  renormalised. ``scale=1.0`` as upstream passes it; vLLM's ``routed_scaling_factor`` is
  applied after, in torch. Serves vLLM's ``grouped_topk`` with sigmoid, the bias and
  ``renormalize``.

Every other routing (no renormalisation, softmax groups, custom functions, a bias
without groups) runs ``ops/moe/routing.py``; the reason is logged once. Observed usage
pins the keywords, not the semantics: the fakes (``tests/fakes/kunlun_ops/_moe.py``)
implement vLLM's, and hardware must confirm the real kernels compute them.
Removal: never; this is the vendor seam for MoE routing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_kunlun.logger import init_logger
from vllm_kunlun.ops import chooser, vendor
from vllm_kunlun.ops.moe import routing

logger = init_logger(__name__)

VENDOR_MODULE = "kunlun_ops"
SOFTMAX_TOPK = "moe_softmax_topk_norm"
SIGMOID_GROUPED = "moe_sigmoid_group_topk_norm"
Kernels = dict[str, Callable[..., Any]]


def load_vendor() -> tuple[Kernels | None, str]:
    """Both routing kernels, or None and why not."""
    found: Kernels = {}
    for name in (SOFTMAX_TOPK, SIGMOID_GROUPED):
        fn, why = vendor.function(VENDOR_MODULE, name)
        if fn is None:
            return None, why
        found[name] = fn
    return found, f"{VENDOR_MODULE}.{SOFTMAX_TOPK} and {SIGMOID_GROUPED} are available"


_selected: dict[torch.device, chooser.Choice[Kernels]] = {}


def select(device: torch.device) -> chooser.Choice[Kernels]:
    """The routing path for tensors on ``device``; chosen and logged once per device."""
    if device not in _selected:
        _selected[device] = chooser.choose(
            chooser.MOE, device, vendor=load_vendor, op="routing"
        )
    return _selected[device]


def reset() -> None:
    """Forget the per-device choices (tests)."""
    _selected.clear()


def kernel_for(r: routing.Routing, has_bias: bool, experts: int) -> str | None:
    """The vendor kernel that computes this routing exactly, or None."""
    if r.custom_routing_function is not None or not r.renormalize:
        return None
    if not r.use_grouped_topk:
        return SOFTMAX_TOPK if r.scoring_func == "softmax" and not has_bias else None
    groups = r.num_expert_group or 0
    valid = experts > groups and groups > 0 and experts % groups == 0
    if valid and r.scoring_func == "sigmoid" and has_bias:
        return SIGMOID_GROUPED
    return None


def select_experts(
    hidden_states: torch.Tensor,
    router_logits: torch.Tensor,
    r: routing.Routing,
    bias: torch.Tensor | None = None,
) -> tuple[tuple[torch.Tensor, torch.Tensor], str]:
    """vLLM's routing, on the vendor kernel where one computes it: ((float32 weights,
    int64 ids), the path taken)."""
    choice = select(router_logits.device)
    experts = router_logits.shape[-1]
    name = kernel_for(r, bias is not None, experts) if choice.vendor else None
    if choice.vendor is None or name is None:
        if choice.vendor is not None:
            logger.info_once(
                "vllm-kunlun: MoE routing %s runs portable torch: no vendor routing "
                "kernel computes it",
                r.kind(bias is not None),
            )
        return routing.select_experts(hidden_states, router_logits, r, bias), "portable"
    tokens = router_logits.shape[0]
    logits = router_logits.float().contiguous()
    weights = torch.empty(tokens, r.top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(tokens, r.top_k, dtype=torch.int32, device=logits.device)
    fn = choice.vendor[name]
    if name == SOFTMAX_TOPK:
        fn(
            x=logits,
            normed_score=weights,
            topk_index=ids,
            block_statistic=None,
            stable=False,
        )
    else:
        assert bias is not None
        fn(
            x=logits,
            norm_score=weights,
            topk_index=ids,
            block_static=None,
            bias=bias.float().contiguous(),
            scale=1.0,
            n_group=r.num_expert_group,
            topk_group=r.topk_group,
        )
        if r.routed_scaling_factor != 1.0:
            weights = weights * r.routed_scaling_factor
    return (weights, ids.to(torch.int64)), "vendor"
