"""Which weight-only checkpoints the platforms accept at start (ops/int8/schemes.py):
AWQ, GPTQ 4 / 8-bit and compressed-tensors W4A16 / W8A16 pack-quantized are served,
other variants refused by name, and a tensor-parallel size that would cut a
quantization group refused naming that size."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm.model_executor.layers.quantization.awq import AWQConfig
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
    CompressedTensorsConfig,
)
from vllm.model_executor.layers.quantization.gptq import GPTQConfig

from vllm_kunlun.demo.tiny_int4 import awq_config, gptq_config, w4a16_config
from vllm_kunlun.ops.int8 import schemes


def ct(config: dict) -> CompressedTensorsConfig:
    return CompressedTensorsConfig.from_config(config)


def test_the_methods_read_at_start() -> None:
    for method in ("compressed-tensors", "awq", "gptq", None):
        schemes.refuse_method(method, "here")
    with pytest.raises(ValueError, match="fp8 quantization cannot run here") as exc:
        schemes.refuse_method("fp8", "here")
    assert "AWQ" in str(exc.value) and "GPTQ" in str(exc.value)


def test_served_weight_only_configs_pass() -> None:
    assert schemes.unsupported_schemes(ct(w4a16_config(32))) == []
    assert schemes.unsupported_schemes(AWQConfig.from_config(awq_config(64))) == []
    for bits in (4, 8):
        config = GPTQConfig.from_config(gptq_config(bits, 128, True, False))
        assert schemes.unsupported_schemes(config) == []


def test_other_weight_only_variants_are_refused_by_name() -> None:
    three = GPTQConfig.from_config(gptq_config(3, 128, False, True))
    assert schemes.unsupported_schemes(three) == ["GPTQ 3-bit weights"]
    actorder = w4a16_config(32)
    actorder["config_groups"]["group_0"]["weights"]["actorder"] = "group"
    (line,) = schemes.unsupported_schemes(ct(actorder))
    assert "self_attn" in line and "4-bit int group static symmetric" in line
    w4a8 = w4a16_config(32)
    w4a8["config_groups"]["group_1"]["input_activations"] = {
        "num_bits": 8,
        "type": "int",
        "symmetric": True,
        "strategy": "token",
        "dynamic": True,
    }
    (line,) = schemes.unsupported_schemes(ct(w4a8))
    assert "mlp" in line and "activations 8-bit int token dynamic" in line
    with pytest.raises(ValueError, match="GPTQ 3-bit weights"):
        schemes.refuse_schemes(three, "here")


QWEN3_32B = SimpleNamespace(
    num_attention_heads=64, head_dim=128, hidden_size=5120, intermediate_size=25600
)
QWEN2_5_72B = SimpleNamespace(  # the unpadded intermediate size of the float model
    num_attention_heads=64, head_dim=128, hidden_size=8192, intermediate_size=29568
)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_group_splits_that_keep_whole_groups_pass(tp: int) -> None:
    config = AWQConfig.from_config(awq_config(128))
    schemes.refuse_group_split(config, QWEN3_32B, tp)


def test_a_split_that_cuts_a_group_is_refused_naming_the_tp_size() -> None:
    config = AWQConfig.from_config(awq_config(128))
    with pytest.raises(ValueError, match="tensor parallel 4 leaves down_proj") as exc:
        schemes.refuse_group_split(config, QWEN2_5_72B, 4)
    assert "29568 / 4 = 7392 features per rank" in str(exc.value)
    assert "group_size 128" in str(exc.value)
    # 231 groups of 128: no split keeps them whole; the AWQ release pads to 29,696
    assert schemes.group_split_problems(config, QWEN2_5_72B, 2) != []
    padded = SimpleNamespace(**{**vars(QWEN2_5_72B), "intermediate_size": 29696})
    assert schemes.group_split_problems(config, padded, 4) == []
    # per-channel schemes have no group to cut
    channel = ct(w4a16_config(32))
    assert schemes.group_split_problems(channel, QWEN3_32B, 3) != []  # attention g32
    gptq = GPTQConfig.from_config(gptq_config(4, -1, False, True))
    assert schemes.group_split_problems(gptq, QWEN2_5_72B, 4) == []
