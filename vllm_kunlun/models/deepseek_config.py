"""DeepSeek-V3 configs as transformers 5.x writes them, read the way vLLM reads them.

Why: vLLM 0.15.1's DeepSeek model (``deepseek_v2.py``, which serves V2, V3, R1 and
Kimi-K2) picks its routing from two config keys that DeepSeek's released
``config.json`` files carry, ``topk_method: noaux_tc`` and ``scoring_func: sigmoid``;
without them it routes by softmax and has no slot for ``e_score_correction_bias``.
transformers' ``DeepseekV3Config`` does not keep those keys, because its model always
routes the V3 way (sigmoid scores, the correction bias in the choice only). A
checkpoint saved by transformers' own ``DeepseekV3ForCausalLM`` would then fail to load
(an unexpected ``e_score_correction_bias``) or, worse, route differently from the
model that wrote it. Likewise vLLM always builds DeepSeek's experts with grouped
top-k and asserts ``n_group`` / ``topk_group``, which a transformers-written V2 config
with ``topk_method: greedy`` leaves None (DeepSeek-V2-Lite's released config says 1 and
1: one group, plain top-k). ``complete_routing`` fills in what is absent, logged once;
a config that names its routing is left as it is. The platform completes the MTP
draft's config too (vLLM reads it again for the draft and calls it ``deepseek_mtp``).

``refuse_sparse`` stops DeepSeek-V3.2 (its DSA indexer, ``index_topk`` in the config)
at engine start, before any weight is read, with the words of the MLA backend's own
refusal (``ops/mla/select.py``): the plugin's MLA backend is dense.

Removal: when vLLM reads a transformers-written DeepSeek-V3 config as V3 routing.
"""

from __future__ import annotations

from typing import Any

from vllm_kunlun.logger import init_logger

logger = init_logger(__name__)

# Model types whose transformers model always routes the DeepSeek-V3 way; vLLM renames
# a DeepSeek-V3 config ``deepseek_mtp`` for its MTP draft (SpeculativeConfig).
V3_ROUTING_TYPES = ("deepseek_v3", "kimi_k2", "deepseek_mtp")
V3_ROUTING = {"topk_method": "noaux_tc", "scoring_func": "sigmoid"}
# Plain top-k as vLLM's grouped routing spells it (DeepSeek-V2-Lite's released values).
GREEDY_GROUPS = {"n_group": 1, "topk_group": 1}


def complete_routing(hf_config: Any) -> dict[str, Any]:
    """Set DeepSeek routing keys on ``hf_config`` where they are absent; returns what
    was set (empty when nothing was)."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type in V3_ROUTING_TYPES:
        wanted: dict[str, Any] = V3_ROUTING
    elif model_type == "deepseek_v2" and getattr(hf_config, "topk_method", None) in (
        None,
        "greedy",
    ):
        wanted = GREEDY_GROUPS
    else:
        return {}
    added = {
        key: value
        for key, value in wanted.items()
        if getattr(hf_config, key, None) is None
    }
    for key, value in added.items():
        setattr(hf_config, key, value)
    if added:
        logger.info_once(
            "vllm-kunlun: %s config without %s: set %s, the routing transformers' "
            "model of it uses",
            model_type,
            " / ".join(added),
            ", ".join(f"{k}={v}" for k, v in added.items()),
        )
    return added


def refuse_sparse(hf_config: Any, where: str) -> None:
    """ValueError for a DeepSeek sparse-attention (DSA) config, which the plugin's dense
    MLA backend cannot serve."""
    from vllm_kunlun.ops.mla.select import SPARSE_REFUSAL

    if getattr(hf_config, "index_topk", None) is not None:
        raise ValueError(SPARSE_REFUSAL.format(where=where))
