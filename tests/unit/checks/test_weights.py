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
