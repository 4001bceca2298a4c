"""DeepSeek-V3 configs as transformers 5.x writes them, read the way vLLM reads them.

Why: vLLM 0.15.1's DeepSeek model (``deepseek_v2.py``, which serves V2, V3, R1 and
Kimi-K2) picks its routing from two config keys that DeepSeek's released
``config.json`` files carry, ``topk_method: noaux_tc`` and ``scoring_func: sigmoid``;
without them it routes by softmax and has no slot for ``e_score_correction_bias``.
transformers' ``DeepseekV3Config`` does not keep those keys, because its model always
routes the V3 way (sigmoid scores, the correction bias in the choice only). A
checkpoint saved by transformers' own ``DeepseekV3ForCausalLM`` would then fail to load
(an unexpected ``e_score_correction_bias``) or, worse, route differently from the
model that wrote it. ``complete_routing`` fills in the V3 routing where the keys are
absent, logged once; a config that names its routing is left as it is.

Removal: when vLLM reads a transformers-written DeepSeek-V3 config as V3 routing.
"""

from __future__ import annotations

from typing import Any

from vllm_kunlun.logger import init_logger

logger = init_logger(__name__)

# Model types whose transformers model always routes the DeepSeek-V3 way.
V3_ROUTING_TYPES = ("deepseek_v3", "kimi_k2")
V3_ROUTING = {"topk_method": "noaux_tc", "scoring_func": "sigmoid"}


def complete_routing(hf_config: Any) -> dict[str, str]:
    """Set DeepSeek-V3 routing on ``hf_config`` where its keys are absent; returns
    what was set (empty when nothing was)."""
    if getattr(hf_config, "model_type", None) not in V3_ROUTING_TYPES:
        return {}
    added = {
        key: value
        for key, value in V3_ROUTING.items()
        if getattr(hf_config, key, None) is None
    }
    for key, value in added.items():
        setattr(hf_config, key, value)
    if added:
        logger.info_once(
            "vllm-kunlun: %s config without %s: set %s, the routing transformers' "
            "DeepSeek-V3 model always uses (sigmoid scores, e_score_correction_bias "
            "in the expert choice)",
            hf_config.model_type,
            " / ".join(added),
            ", ".join(f"{k}={v}" for k, v in added.items()),
        )
    return added
