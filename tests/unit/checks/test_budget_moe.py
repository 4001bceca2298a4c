"""The doctor's weight and KV budget for Qwen3.5-MoE configs (issue 22).

Fixtures: the three released configs (tests/unit/checks/qwen3_5_moe_configs.py says
where each value comes from). Settings: the deployment log's (docs/deploy.md: TP 8,
--gpu-memory-utilization 0.75, --max-num-seqs 256) on 96 GiB P800 cards.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.unit.checks.hybrid_budget_cases import GIB, P800, write_model_dir
from tests.unit.checks.qwen3_5_moe_configs import CONFIGS, PUBLISHED_TOTAL_PARAMS, w8a8
from vllm_kunlun.checks.budget import check_kv_budget
from vllm_kunlun.checks.finding import Context, Finding
from vllm_kunlun.checks.memory_budget import estimate
from vllm_kunlun.checks.model_shape import ModelShape
from vllm_kunlun.checks.moe_params import estimate_moe_weights, moe_tensors

LOG = {"tensor_parallel_size": 8, "gpu_memory_utilization": 0.75, "max_num_seqs": 256}


def _dir(tmp_path: Path, config: dict[str, Any], weights: int = 0) -> str:
    return write_model_dir(tmp_path, config, weights, name="moe")


def _check(model: str, **kw: Any) -> Finding:
    settings = {**LOG, **kw}
    return check_kv_budget(Context(model=model, device_memory_bytes=P800, **settings))


def _transformers_count(config: dict[str, Any]) -> tuple[int, int]:
    """(all parameters, vision tower's) of transformers 5.2.0's model, on the meta
    device (no memory)."""
    import torch
    from transformers import Qwen3_5MoeConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
        Qwen3_5MoeForConditionalGeneration,
    )

    text = {k: v for k, v in config["text_config"].items() if k != "model_type"}
    hf = Qwen3_5MoeConfig(text_config=text, vision_config=config["vision_config"])
    with torch.device("meta"):
        model = Qwen3_5MoeForConditionalGeneration(hf)
    named = list(model.named_parameters())
    return sum(p.numel() for _, p in named), sum(
        p.numel() for n, p in named if ".visual." in f".{n}"
    )


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parameter_count_is_transformers_own(name: str) -> None:
    est = estimate_moe_weights(CONFIGS[name])
    assert est is not None
    total, vision = _transformers_count(CONFIGS[name])
    assert (est.total_params, est.vision_params) == (total, vision)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parameter_count_matches_the_published_total(name: str) -> None:
    # 35.11B, 122.56B, 396.80B against 35B, 122B, 397B: within 0.5 %, evidence that
    # the fixture values and the formula are the released models'.
    est = estimate_moe_weights(CONFIGS[name])
    assert est is not None
    published = PUBLISHED_TOTAL_PARAMS[name]
    assert abs(est.total_params - published) / published < 0.005


def test_the_experts_are_almost_all_of_it() -> None:
    est = estimate_moe_weights(CONFIGS["397B-A17B"])
    assert est is not None
    # 60 layers x 512 experts x 3 x 4096 x 1024
    assert est.by_group["experts"] == 60 * 512 * 3 * 4096 * 1024
    assert est.by_group["shared_expert"] == 60 * 3 * 4096 * 1024
    assert est.by_group["router"] == 60 * (512 * 4096 + 4096)  # + shared_expert_gate


def test_per_card_splits_experts_and_replicates_routers_and_kv_heads() -> None:
    config = CONFIGS["35B-A3B"]
    est = estimate_moe_weights(config)
    assert est is not None
    t = {x.name: x for x in moe_tensors(config)}
    p = "model.language_model.layers."
    # K / V: 2 heads of 256 at TP 8: one head per card (replicated 4x), not 2/8
    assert t[p + "3.self_attn.k_proj"].rows_per_card(8) == 256
    assert t[p + "0.mlp.gate"].rows_per_card(8) == 256  # the router, on every card
    assert t[p + "0.mlp.experts.0.gate_proj"].rows_per_card(8) == 512 / 8
    replicated = sum(
        x.params for x in t.values() if x.split in ("replicated", "kv")
    )  # bounded: what total / TP would miss is small
    per_card = est.per_card(8)
    assert est.text_params * 2 / 8 < per_card < (est.text_params / 8 + replicated) * 2


def test_w8a8_int8_where_the_ignore_list_does_not_say_otherwise() -> None:
    config = w8a8(CONFIGS["122B-A10B"])
    est = estimate_moe_weights(config)
    assert est is not None and est.quantized
    int8_names = {est.tensors[i].name.rsplit(".", 1)[-1] for i in est.int8}
    assert {"q_proj", "in_proj_qkv", "gate_proj", "down_proj", "out_proj"} <= int8_names
    bf16 = {t.name for i, t in enumerate(est.tensors) if i not in est.int8}
    assert "lm_head" in bf16
    assert "model.language_model.layers.0.mlp.gate" in bf16
    assert "model.language_model.layers.0.mlp.shared_expert_gate" in bf16
    assert "model.language_model.embed_tokens" in bf16  # not a linear
    bf16_est = estimate_moe_weights(CONFIGS["122B-A10B"])
    assert bf16_est is not None
    # int8 experts: a little over half the bfloat16 bytes (scales, bf16 embeddings)
    assert 0.5 < est.per_card(8) / bf16_est.per_card(8) < 0.52
    # a checkpoint that also keeps the GDN projections in bf16 is larger
    more = copy.deepcopy(config)
    more["quantization_config"]["ignore"].append("re:.*linear_attn.*")
    bigger = estimate_moe_weights(more)
    assert bigger is not None and bigger.per_card(8) > est.per_card(8)


def test_shape_reads_the_hybrid_and_the_moe_fields() -> None:
    shape = ModelShape.from_config(CONFIGS["35B-A3B"])
    assert (shape.num_layers, shape.linear_layers, shape.attention_layers) == (
        40,
        30,
        10,
    )
    assert (shape.num_experts, shape.experts_per_tok) == (256, 8)
    assert shape.moe_intermediate_size == shape.shared_expert_intermediate_size == 512
    # 10 attention layers x K,V x max(1, 2 // 8) head x 256 x 2 B
    assert shape.kv_bytes_per_token(8) == 10 * 2 * 1 * 256 * 2
    # GDN page at TP 8: conv 3 x (2*16*128 + 32*128)/8 + 32/8 x 128 x 128, bf16
    assert shape.state_page_bytes(8) == (3 * 1024 + 4 * 128 * 128) * 2


def test_moe_text_config_without_layer_types_gets_the_interval() -> None:
    config = copy.deepcopy(CONFIGS["35B-A3B"])
    del config["text_config"]["layer_types"]
    shape = ModelShape.from_config(config)
    assert (shape.linear_layers, shape.attention_layers) == (30, 10)


def test_moe_workspace_comes_out_of_the_kv_cache() -> None:
    shape = ModelShape.from_config(CONFIGS["397B-A17B"])
    b = estimate(
        shape,
        device_bytes=P800,
        utilization=0.75,
        tp=8,
        max_num_seqs=256,
        weights_bytes=40 * GIB,
    )
    assert b.activation_tokens == 8192  # vllm serve's default on a >= 70 GiB card
    assert b.activation_bytes == shape.moe_workspace_bytes(8, 8192) > GIB
    assert b.kv_bytes == 0.75 * P800 - 40 * GIB - b.activation_bytes
    assert any("MoE activation workspace at 8192" in a for a in b.arithmetic())
    small = estimate(
        shape,
        device_bytes=32 * GIB,
        utilization=0.75,
        tp=8,
        max_num_seqs=256,
        weights_bytes=0,
    )
    assert small.activation_tokens == 2048
    dense = ModelShape.from_config(
        {**CONFIGS["35B-A3B"]["text_config"], "model_type": "qwen3_5_text"}
    )
    assert dense.moe_workspace_bytes(8, 8192) == 0


# The verdicts at the log's settings (docs/models.md, "Qwen3.5-MoE budgets").
FITS = [
    ("35B-A3B", False, 0.92),
    ("35B-A3B", True, 0.92),
    ("122B-A10B", False, 0.90),
    ("122B-A10B", True, 0.90),
    ("397B-A17B", True, 0.90),
]


@pytest.mark.parametrize(("name", "int8", "safe"), FITS)
def test_fits_at_tp8(tmp_path: Path, name: str, int8: bool, safe: float) -> None:
    config = w8a8(CONFIGS[name]) if int8 else CONFIGS[name]
    f = _check(_dir(tmp_path, config))
    assert f.status == "ok", f.cause
    assert f.details["max_safe_utilization"] == safe
    assert f.details["kv_tokens"] > 262_144  # one request of the full context fits
    assert "estimated from config.json (MoE" in f.details["weights_source"]
    assert "vision tower" in f.details["weights_source"]


def test_397b_bf16_does_not_fit_on_one_host(tmp_path: Path) -> None:
    f = _check(_dir(tmp_path, CONFIGS["397B-A17B"]))
    assert f.status == "fail"
    assert "at any --gpu-memory-utilization" in f.cause
    assert "weights 92.53 GiB" in f.cause
    # the fixes, in order: the W8A8 checkpoint (which fits), a second pipeline stage
    # (on a second host, through Ray), fewer sequences
    assert f.fix.startswith("use a W8A8-INT8 checkpoint (~46.71 GiB per card")
    assert "--pipeline-parallel-size 2" in f.fix and "ray" in f.fix
    assert "--max-num-seqs" in f.fix


def test_397b_bf16_on_four_cards_says_raise_tp(tmp_path: Path) -> None:
    f = _check(_dir(tmp_path, CONFIGS["397B-A17B"]), tensor_parallel_size=4)
    assert f.status == "fail"
    assert "even a W8A8-INT8 checkpoint" in f.fix and "would not fit" in f.fix
    assert "raise --tensor-parallel-size (up to the host's 8 cards)" in f.fix


def test_397b_w8a8_at_090_leaves_the_state_no_room(tmp_path: Path) -> None:
    f = _check(_dir(tmp_path, w8a8(CONFIGS["397B-A17B"])), gpu_memory_utilization=0.95)
    assert f.status == "warn"
    assert f.fix.startswith("use --gpu-memory-utilization 0.90")


def test_weight_files_win_over_the_config(tmp_path: Path) -> None:
    f = _check(_dir(tmp_path, CONFIGS["35B-A3B"], weights=80 * GIB))
    assert f.details["weights_bytes"] == 10 * GIB
    assert f.details["weights_source"] == "weight files"


def test_missing_moe_field_is_named(tmp_path: Path) -> None:
    config = copy.deepcopy(CONFIGS["35B-A3B"])
    del config["text_config"]["num_experts"]
    f = _check(_dir(tmp_path, config))
    assert f.status == "fail"
    assert "text_config.num_experts is missing" in f.cause
