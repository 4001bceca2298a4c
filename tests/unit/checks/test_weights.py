"""Weight memory from config.json (checks/weights.py) and the budget check using it.

The 27B numbers are the log's model family (``QWEN3_5_27B``: hidden 5120, intermediate
17408, 64 layers of which 48 Gated DeltaNet, 24 query heads and 4 KV heads of 256, GDN
16 key / 48 value heads of 128, vocab 248,320, untied), worked out by hand below.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from vllm_kunlun.checks.budget import check_kv_budget
from vllm_kunlun.checks.finding import Context
from vllm_kunlun.checks.weights import QWEN3_5_27B, estimate_weights, linear_layers
from vllm_kunlun.demo.tiny_quant import w8a8_dynamic_config, write_tiny_w8a8

GIB = 1 << 30
CONFIG_27B = QWEN3_5_27B
W8A8_27B = {**CONFIG_27B, "quantization_config": w8a8_dynamic_config(["lm_head"])}

# linear parameters per layer:
#   full attention: q 2*24*256 x 5120 + k, v 1024 x 5120 + o 5120 x 6144 = 104,857,600
#   GDN: in_proj_qkv (2*2048 + 6144) x 5120 + z 6144 x 5120 + b, a 48 x 5120
#        + out 5120 x 6144                                             = 115,834,880
#   MLP: 3 x 17408 x 5120                                              = 267,386,880
# 16 x (104,857,600 + 267,386,880) + 48 x (115,834,880 + 267,386,880) = 24,350,556,160
LINEAR_PARAMS = 24_350_556_160
# float32 channel scales: 4 B x (16 x 19,456 + 48 x 21,600 + 64 x 39,936) = 15,616,000
SCALE_BYTES = 15_616_000
EMBED_AND_HEAD_BF16 = 2 * 248_320 * 5120 * 2  # 5,085,593,600


def test_27b_linear_layers_as_transformers_builds_them() -> None:
    layers = linear_layers(CONFIG_27B)
    assert layers is not None
    assert sum(layer.params for layer in layers) == LINEAR_PARAMS
    by_name = {layer.name: layer for layer in layers}
    assert (by_name["self_attn.q_proj"].out, by_name["self_attn.q_proj"].layers) == (
        12288,
        16,
    )
    assert by_name["linear_attn.in_proj_qkv"].out == 10240
    assert by_name["mlp.down_proj"].layers == 64


def test_w8a8_counts_int8_linear_weights() -> None:
    w8a8, bf16 = estimate_weights(W8A8_27B), estimate_weights(CONFIG_27B)
    assert w8a8 is not None and bf16 is not None
    assert w8a8.total_bytes == LINEAR_PARAMS + SCALE_BYTES + EMBED_AND_HEAD_BF16
    assert bf16.total_bytes == 2 * LINEAR_PARAMS + EMBED_AND_HEAD_BF16
    assert w8a8.per_card(8) == 3_681_470_720  # 3.43 GiB at TP 8 (bf16: 6.26 GiB)
    assert w8a8.int8_linear_params == LINEAR_PARAMS and bf16.int8_linear_params == 0
    assert "W8A8" in w8a8.source


def test_ignored_layers_stay_16_bit() -> None:
    ignore = ["lm_head", "re:.*linear_attn\\.in_proj_[ab]$"]
    config = {**CONFIG_27B, "quantization_config": w8a8_dynamic_config(ignore)}
    est = estimate_weights(config)
    assert est is not None
    ba = 2 * 48 * 5120 * 48  # in_proj_b and in_proj_a, 48 layers
    assert est.int8_linear_params == LINEAR_PARAMS - ba


def test_unknown_family_or_missing_dimension_is_no_estimate() -> None:
    text = CONFIG_27B["text_config"]
    assert estimate_weights({**text, "model_type": "deepseek_v3"}) is None
    no_inter = {k: v for k, v in text.items() if k != "intermediate_size"}
    assert estimate_weights(no_inter) is None


def test_budget_uses_the_int8_estimate_without_weight_files(tmp_path: Path) -> None:
    d = tmp_path / "Qwen3.8-27B-W8A8-INT8-Dynamic"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(W8A8_27B))
    f = check_kv_budget(
        Context(model=str(d), tensor_parallel_size=8, device_memory_bytes=96 * GIB)
    )
    assert f.details["weights_bytes"] == 3_681_470_720
    assert f.details["weights_source"].startswith("estimated from config.json (W8A8")
    assert "weights per card = 3.43 GiB [estimated" in f.details["arithmetic"][2]


def test_estimate_matches_the_tiny_w8a8_checkpoint(tmp_path: Path) -> None:
    """Against the bytes actually written (norms left out, as the estimate says)."""
    d = write_tiny_w8a8(tmp_path / "tiny")
    written = sum(
        t.numel() * t.element_size()
        for k, t in load_file(str(d / "model.safetensors")).items()
        if not k.endswith("norm.weight")
    )
    est = estimate_weights(json.loads((d / "config.json").read_text()))
    assert est is not None and est.total_bytes == written


@pytest.mark.parametrize(
    ("key", "value"),
    [("num_hidden_layers", 1e30), ("num_attention_heads", -24), ("hidden_size", 0)],
)
def test_hostile_dimensions_give_no_estimate(key: str, value: object) -> None:
    """1e30 layers used to build a 1e30-entry layer list; a negative head count gave
    a negative weight size that the budget then accepted."""
    text = {**CONFIG_27B["text_config"], key: value}
    if key == "num_hidden_layers":
        text.pop("layer_types")  # the interval default builds the list
    assert estimate_weights({**CONFIG_27B, "text_config": text}) is None


# ---- weight-only 4-bit (AWQ, GPTQ, compressed-tensors W4A16) --------------------------

QWEN3_32B_AWQ = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 5120,
    "intermediate_size": 25600,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "quantization_config": {
        "quant_method": "awq",
        "bits": 4,
        "group_size": 128,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": None,
    },
}
# linear params: 64 x (2 x 5120 x 8192 + 2 x 5120 x 1024 + 3 x 5120 x 25600)
#   = 31,205,621,760; 4-bit: 15,602,810,880; float16 scales per 128: 487,587,840;
#   4-bit zero points per 128: 121,896,960; embeddings + lm_head float16:
#   2 x 151,936 x 5120 x 2 = 3,111,649,280. Total 19,323,944,960 (19.3 GB, the size of
#   the published Qwen3-32B-AWQ safetensors, norms aside).
QWEN3_32B_AWQ_BYTES = 19_323_944_960
QWEN2_5_72B_AWQ = {
    **QWEN3_32B_AWQ,
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 8192,
    "intermediate_size": 29696,  # padded from 29,568 so TP 4 / 8 keep whole groups
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 152064,
}
# 80 x (2 x 8192^2 + 2 x 8192 x 1024 + 3 x 8192 x 29696) = 70,464,307,200 linear
# params: 35,232,153,600 + 1,101,004,800 + 275,251,200 + 2 x 152,064 x 8192 x 2
# (4,982,833,152) = 41,591,242,752 (biases and norms aside).
QWEN2_5_72B_AWQ_BYTES = 41_591_242_752


def test_awq_estimates_count_4_bit_weights_scales_and_zero_points() -> None:
    est = estimate_weights(QWEN3_32B_AWQ)
    assert est is not None and est.total_bytes == QWEN3_32B_AWQ_BYTES
    assert est.source.startswith("estimated from config.json (AWQ: 4-bit")
    est = estimate_weights(QWEN2_5_72B_AWQ)
    assert est is not None and est.total_bytes == QWEN2_5_72B_AWQ_BYTES
    fp16 = {k: v for k, v in QWEN3_32B_AWQ.items() if k != "quantization_config"}
    est16 = estimate_weights(fp16)
    assert est16 is not None
    # the 4-bit linears are 3.8x smaller than float16 (weights + 1/32 for scales)
    assert est16.total_bytes - 3_111_649_280 == 2 * 31_205_621_760


@pytest.mark.parametrize(
    ("config", "tp", "per_card"),
    [
        (QWEN3_32B_AWQ, 1, QWEN3_32B_AWQ_BYTES),
        (QWEN3_32B_AWQ, 2, QWEN3_32B_AWQ_BYTES // 2),
        (QWEN2_5_72B_AWQ, 4, QWEN2_5_72B_AWQ_BYTES // 4),
    ],
    ids=["qwen3-32b-awq-tp1", "qwen3-32b-awq-tp2", "qwen2.5-72b-awq-tp4"],
)
def test_budget_counts_awq_weights_per_card(
    tmp_path: Path, config: dict, tp: int, per_card: int
) -> None:
    d = tmp_path / "awq"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    f = check_kv_budget(
        Context(model=str(d), tensor_parallel_size=tp, device_memory_bytes=96 * GIB)
    )
    assert f.details["weights_bytes"] == per_card
    assert "AWQ: 4-bit linear weights" in f.details["weights_source"]


@pytest.mark.parametrize("fmt", ["awq", "gptq", "w4a16"])
def test_estimate_matches_the_tiny_4_bit_checkpoints(tmp_path: Path, fmt: str) -> None:
    """Against the bytes written (norms and compressed-tensors' 16-byte
    ``weight_shape`` records left out, as the estimate says)."""
    from vllm_kunlun.demo import tiny_int4

    writer = {
        "awq": tiny_int4.write_tiny_awq,
        "gptq": tiny_int4.write_tiny_gptq,
        "w4a16": tiny_int4.write_tiny_w4a16,
    }[fmt]
    d = writer(tmp_path / fmt)
    written = sum(
        t.numel() * t.element_size()
        for k, t in load_file(str(d / "model.safetensors")).items()
        if not k.endswith(("norm.weight", "weight_shape"))
    )
    est = estimate_weights(json.loads((d / "config.json").read_text()))
    assert est is not None and est.total_bytes == written
