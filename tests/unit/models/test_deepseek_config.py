"""DeepSeek configs as transformers 5.2.0 writes them (vllm_kunlun/models/deepseek_config.py):
the routing keys vLLM reads are filled in where transformers' config class dropped
them, never over what a config names; V3.2's sparse attention is refused."""

from __future__ import annotations

import pytest
from transformers import DeepseekV2Config, DeepseekV3Config

from vllm_kunlun.models.deepseek_config import complete_routing, refuse_sparse


def test_a_transformers_v3_config_gets_v3_routing() -> None:
    config = DeepseekV3Config(num_hidden_layers=2)
    assert getattr(config, "topk_method", None) is None  # what transformers keeps
    added = complete_routing(config)
    assert added == {"topk_method": "noaux_tc", "scoring_func": "sigmoid"}
    assert (config.topk_method, config.scoring_func) == ("noaux_tc", "sigmoid")
    assert complete_routing(config) == {}  # idempotent


def test_a_released_config_keeps_what_it_names() -> None:
    config = DeepseekV3Config(num_hidden_layers=2)
    config.topk_method, config.scoring_func = "greedy", "softmax"
    assert complete_routing(config) == {}
    assert (config.topk_method, config.scoring_func) == ("greedy", "softmax")


def test_a_transformers_v2_config_gets_one_group_for_plain_top_k() -> None:
    config = DeepseekV2Config(num_hidden_layers=2, topk_method="greedy")
    assert config.n_group is None
    assert complete_routing(config) == {"n_group": 1, "topk_group": 1}
    grouped = DeepseekV2Config(
        num_hidden_layers=2, topk_method="group_limited_greedy", n_group=8, topk_group=3
    )
    assert complete_routing(grouped) == {}
    assert (grouped.n_group, grouped.topk_group) == (8, 3)


def test_other_models_are_untouched() -> None:
    from transformers import Qwen3Config

    config = Qwen3Config(num_hidden_layers=2)
    assert complete_routing(config) == {}
    assert getattr(config, "topk_method", None) is None


def test_sparse_attention_configs_are_refused() -> None:
    config = DeepseekV3Config(num_hidden_layers=2)
    refuse_sparse(config, "on Kunlun")  # dense: nothing to say
    config.index_topk = 2048  # DeepSeek-V3.2's indexer
    with pytest.raises(ValueError, match="DSA lightning indexer"):
        refuse_sparse(config, "on Kunlun")


def test_the_mtp_draft_config_vllm_derives_gets_v3_routing() -> None:
    # vLLM reads the checkpoint's config again for a DeepSeek MTP draft and renames it
    # (its own SpeculativeConfig.hf_config_override): the draft routes as the target.
    from vllm.config.speculative import SpeculativeConfig

    config = DeepseekV3Config(num_hidden_layers=2, num_nextn_predict_layers=1)
    config.architectures = ["DeepseekV3ForCausalLM"]
    draft = SpeculativeConfig.hf_config_override(config)
    assert draft.model_type == "deepseek_mtp"
    assert complete_routing(draft) == {
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
    }
