"""kunlun_qwen3_5_mtp_config: vLLM's speculative config maps Qwen3.5 to the plugin's
MTP draft models (vllm_kunlun/models/speculative_config.py), in vLLM 0.15.1's own
``SpeculativeConfig`` code paths."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import get_args

import pytest
from transformers import PretrainedConfig
from vllm.config import speculative

from vllm_kunlun.models import speculative_config as S


@pytest.fixture
def applied() -> Iterator[None]:
    was = all(p.applied() for p in S.PATCHES)
    S.apply()
    yield
    if not was:
        S.revert()


def _config(model_type: str, text: bool) -> PretrainedConfig:
    rope = {"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 1e4}
    inner = PretrainedConfig(mtp_num_hidden_layers=1, rope_parameters=dict(rope))
    cfg = PretrainedConfig(architectures=["X"])
    cfg.model_type = model_type
    if text:
        cfg.text_config = inner
    else:
        cfg.update({"mtp_num_hidden_layers": 1, "rope_parameters": dict(rope)})
    return cfg


@pytest.mark.parametrize(
    ("model_type", "text", "arch"),
    [
        ("qwen3_5", True, "Qwen3_5MTP"),
        ("qwen3_5_text", False, "Qwen3_5MTP"),
        ("qwen3_5_moe", True, "Qwen3_5MoeMTP"),
        ("qwen3_5_moe_text", False, "Qwen3_5MoeMTP"),
    ],
)
def test_qwen3_5_model_types_map_to_the_plugins_drafts(
    applied: None, model_type: str, text: bool, arch: str
) -> None:
    cfg = speculative.SpeculativeConfig.hf_config_override(_config(model_type, text))
    assert (cfg.model_type, cfg.architectures, cfg.n_predict) == (
        "qwen3_5_mtp",
        [arch],
        1,
    )
    inner = cfg.text_config if text else cfg
    assert "mrope_section" not in inner.rope_parameters  # 1-D draft positions
    assert "qwen3_5_mtp" in get_args(speculative.MTPModelTypes)


def test_other_models_keep_vllms_mapping(applied: None) -> None:
    cfg = speculative.SpeculativeConfig.hf_config_override(_config("qwen3_next", False))
    assert (cfg.model_type, cfg.architectures) == ("qwen3_next_mtp", ["Qwen3NextMTP"])


def test_the_override_pickles_to_the_engine_core(applied: None) -> None:
    # The draft ModelConfig keeps it as hf_overrides; a multiprocessing engine
    # pickles the config (a local function failed there).
    fn = speculative.SpeculativeConfig.hf_config_override
    assert pickle.loads(pickle.dumps(fn)) is fn


def test_revert_restores_vllm(applied: None) -> None:
    S.revert()
    assert speculative.SpeculativeConfig.hf_config_override is not S.hf_config_override
    assert "qwen3_5_mtp" not in get_args(speculative.MTPModelTypes)
    S.apply()
