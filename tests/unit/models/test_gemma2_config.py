"""transformers 5.2.0's saved Gemma 2 config gains the ``hidden_act`` vLLM reads."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from transformers import AutoConfig, Gemma2Config, LlamaConfig

from vllm_kunlun.models.gemma2_config import fill_hidden_act


def engine_config(hf_config: Any) -> Any:
    return SimpleNamespace(model_config=SimpleNamespace(hf_text_config=hf_config))


def test_a_config_saved_by_transformers_gets_hidden_act(tmp_path: Path) -> None:
    Gemma2Config(hidden_activation="gelu_pytorch_tanh").save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert getattr(config, "hidden_act", None) is None  # what vLLM trips over
    assert fill_hidden_act(engine_config(config))  # type: ignore[arg-type]
    assert config.hidden_act == "gelu_pytorch_tanh"
    assert not fill_hidden_act(engine_config(config))  # type: ignore[arg-type]


def test_released_configs_and_other_families_are_left_alone(tmp_path: Path) -> None:
    # A released config.json carries both keys: they stay as written.
    config = Gemma2Config(hidden_activation="gelu_pytorch_tanh")
    config.hidden_act = "gelu"
    assert not fill_hidden_act(engine_config(config))  # type: ignore[arg-type]
    assert config.hidden_act == "gelu"
    llama = LlamaConfig()
    assert not fill_hidden_act(engine_config(llama))  # type: ignore[arg-type]
    assert not fill_hidden_act(SimpleNamespace(model_config=None))  # type: ignore[arg-type]
