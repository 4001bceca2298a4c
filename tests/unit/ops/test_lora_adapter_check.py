"""The adapter-load refusal of modules a model wraps for LoRA but never runs
(vllm_kunlun/ops/lora/adapter_check.py: ``check_served_modules``), on the Qwen3.5
class's own declaration; the e2e test (tests/integration/test_e2e_lora_hybrid.py)
sees it through vLLM's loader."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_kunlun.models.qwen3_5 import Qwen3_5ForCausalLM
from vllm_kunlun.ops.lora.adapter_check import check_served_modules


class _Model:  # named like the class whose declaration it carries
    LORA_REFUSED_MODULES = Qwen3_5ForCausalLM.LORA_REFUSED_MODULES


_Model.__name__ = "Qwen3_5ForCausalLM"


def _lora(*modules: str) -> SimpleNamespace:
    return SimpleNamespace(loras={m: object() for m in modules})


def test_an_adapter_on_conv1d_is_refused_naming_the_module() -> None:
    manager = SimpleNamespace(model=_Model())
    lora = _lora(
        "model.layers.0.linear_attn.in_proj_z",
        "model.layers.1.linear_attn.conv1d",
        "model.layers.0.linear_attn.conv1d",
    )
    with pytest.raises(ValueError) as refused:
        check_served_modules(manager, lora, "demo (/adapters/demo)")
    message = str(refused.value)
    assert "'demo (/adapters/demo)' targets conv1d (2 modules" in message
    assert "first model.layers.0.linear_attn.conv1d" in message
    assert "Qwen3_5ForCausalLM does not serve" in message


@pytest.mark.parametrize(
    "model", [_Model(), object()], ids=["qwen3_5", "no-declaration"]
)
def test_covered_modules_pass(model: object) -> None:
    lora = _lora(
        "model.layers.0.linear_attn.in_proj_qkv",
        "model.layers.0.linear_attn.out_proj",
        "model.layers.3.self_attn.qkv_proj",
    )
    check_served_modules(SimpleNamespace(model=model), lora, "ok")


def test_conv1d_passes_where_the_model_declares_nothing() -> None:
    lora = _lora("model.layers.0.linear_attn.conv1d")
    check_served_modules(SimpleNamespace(model=object()), lora, "other")
