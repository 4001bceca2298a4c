"""The doctor's weight / KV budget for the other MoE families (issue 41): Qwen3-MoE,
Qwen3-Next, GLM-4.5 (``checks/moe_families.py``), from the released config.json alone.

Fixtures: ``moe_family_configs/<model>/config.json``, the released models' configs
written from their published values (read 2026-12 from public copies: the Hugging Face
config.json of Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B,
Qwen/Qwen3-Next-80B-A3B-Instruct, zai-org/GLM-4.5-Air and zai-org/GLM-4.7 as quoted in
public repositories, and the Megatron argument files for Qwen3-30B-A3B,
Qwen3-235B-A22B, GLM-4.5-106B-A12B and GLM-4.5-355B-A32B in the scripts folder of
THUDM/slime's forks, which agree on every dimension; GLM-4.7 has GLM-4.5's
355B architecture with ``max_position_embeddings`` 202752). The W8A8-INT8 variants
are the same configs with the compressed-tensors block Baidu's W8A8 checkpoints carry
(``qwen3_5_moe_configs.w8a8``: routers and lm_head kept in bfloat16).

The count is checked against transformers 5.2.0's own models (meta device) and the
published totals; the verdicts are those docs/models.md reports (96 GiB P800 cards,
--gpu-memory-utilization 0.90, --max-num-seqs 256).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.checks.qwen3_5_moe_configs import w8a8
from vllm_kunlun.checks.budget import ModelShape, check_kv_budget
from vllm_kunlun.checks.finding import Context, Finding
from vllm_kunlun.checks.moe_families import family_tensors
from vllm_kunlun.checks.moe_params import estimate_moe_weights

GIB = 1 << 30
P800 = 96 * GIB
FIXTURES = Path(__file__).parent / "moe_family_configs"
CONFIGS: dict[str, dict[str, Any]] = {
    d.name: json.loads((d / "config.json").read_text())
    for d in sorted(FIXTURES.iterdir())
    if (d / "config.json").is_file()
}
# Published totals and active parameters (model names and cards), and whether the
# card's active count includes the embeddings and lm_head (Qwen3's cards do; Qwen3-Next's
# and GLM's count without them).
PUBLISHED = {
    "Qwen3-30B-A3B": (30.5e9, 3.3e9, True),
    "Qwen3-235B-A22B": (235e9, 22e9, True),
    "Qwen3-Next-80B-A3B-Instruct": (80e9, 3e9, False),
    "GLM-4.5-Air": (106e9, 12e9, False),
    "GLM-4.7": (355e9, 32e9, False),
}


def test_the_fixtures_are_the_five_released_configs() -> None:
    assert sorted(CONFIGS) == sorted(PUBLISHED)


def _transformers_count(config: dict[str, Any]) -> int:
    """Parameters of transformers 5.2.0's model on the meta device, plus GLM's
    ``e_score_correction_bias`` (a buffer there, a tensor in the checkpoint)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k != "architectures"}
    hf = AutoConfig.for_model(**fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    assert type(model).__name__ == config["architectures"][0]
    buffers = sum(
        b.numel() for n, b in model.named_buffers() if "e_score_correction_bias" in n
    )
    return sum(p.numel() for p in model.parameters()) + buffers


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_is_transformers_own(name: str) -> None:
    est = estimate_moe_weights(CONFIGS[name])
    assert est is not None
    assert est.total_params == _transformers_count(CONFIGS[name])


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_total_and_active_match_the_published_ones(name: str) -> None:
    config = CONFIGS[name]
    est = estimate_moe_weights(config)
    assert est is not None
    total, active, with_embeddings = PUBLISHED[name]
    # 30.53B, 235.09B, 79.67B, 106.85B, 352.80B (GLM-4.7's 355B includes its MTP
    # layer, which vLLM's target model does not load and this count leaves out).
    assert abs(est.total_params - total) / total < 0.01
    g = est.by_group
    experts = config.get("num_experts") or config["n_routed_experts"]
    routed_active = g["experts"] * config["num_experts_per_tok"] // experts
    ours = est.total_params - g["experts"] + routed_active
    if not with_embeddings:
        ours -= g["embeddings"] + g["lm_head"]
    # 3.35B, 22.19B, 3.25B, 12.18B, 32.07B
    assert abs(ours - active) / active < 0.1, ours


def test_qwen3_30b_a3b_by_hand() -> None:
    est = estimate_moe_weights(CONFIGS["Qwen3-30B-A3B"])
    assert est is not None
    # 48 layers x 128 experts x 3 x 2048 x 768
    assert est.by_group["experts"] == 48 * 128 * 3 * 2048 * 768
    # q 32x128, k / v 4x128, o: (4096 + 512 + 512) x 2048 + 2048 x 4096, q / k norms
    assert est.by_group["attention"] == 48 * (5120 * 2048 + 2048 * 4096)
    assert est.per_card(1) == est.total_params * 2  # bfloat16, nothing replicated


def test_glm_dense_first_layers_shared_expert_and_qk_norm() -> None:
    tensors = {t.name: t for t in family_tensors(CONFIGS["GLM-4.7"]) or []}
    p = "model.layers."
    for i in range(3):  # first_k_dense_replace 3: dense MLPs of width 12288
        assert tensors[f"{p}{i}.mlp.gate_proj"].rows == 12288
        assert f"{p}{i}.mlp.gate" not in tensors
    assert tensors[f"{p}3.mlp.gate"].rows == 160
    assert tensors[f"{p}3.mlp.shared_experts.up_proj"].rows == 1536  # 1 x 1536
    assert f"{p}3.self_attn.q_norm" in tensors  # use_qk_norm
    assert f"{p}3.self_attn.q_proj.bias" in tensors  # attention_bias
    assert f"{p}3.self_attn.o_proj.bias" not in tensors
    air = {t.name for t in family_tensors(CONFIGS["GLM-4.5-Air"]) or []}
    assert f"{p}1.self_attn.q_norm" not in air
    assert f"{p}1.mlp.gate" in air and f"{p}0.mlp.gate" not in air


def test_shapes_read_the_family_fields() -> None:
    glm = ModelShape.from_config(CONFIGS["GLM-4.7"])
    assert (glm.num_experts, glm.experts_per_tok) == (160, 8)
    assert glm.shared_expert_intermediate_size == glm.moe_intermediate_size == 1536
    # 92 layers x K,V x one of 8 KV heads per card at TP 8 x 128 x 2 B
    assert glm.kv_bytes_per_token(8) == 92 * 2 * 1 * 128 * 2
    nxt = ModelShape.from_config(CONFIGS["Qwen3-Next-80B-A3B-Instruct"])
    assert (nxt.linear_layers, nxt.attention_layers) == (36, 12)  # interval 4
    assert (nxt.num_experts, nxt.experts_per_tok) == (512, 10)
    # GDN page at TP 4: conv 3 x (2 x 16 x 128 + 32 x 128) / 4 + 8 heads x 128 x 128
    assert nxt.state_page_bytes(4) == (3 * 2048 + 8 * 128 * 128) * 2
    qwen = ModelShape.from_config(CONFIGS["Qwen3-30B-A3B"])
    assert (qwen.num_experts, qwen.shared_expert_intermediate_size) == (128, 0)
    assert qwen.moe_workspace_bytes(1, 8192) > 0


def _check(tmp_path: Path, config: dict[str, Any], tp: int) -> Finding:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    ctx = Context(
        model=str(d),
        device_memory_bytes=P800,
        tensor_parallel_size=tp,
        gpu_memory_utilization=0.9,
        max_num_seqs=256,
    )
    return check_kv_budget(ctx)


# (model, TP, W8A8, status, weights GiB per card), docs/models.md's table.
VERDICTS = [
    ("Qwen3-30B-A3B", 1, False, "ok", 56.87),
    ("Qwen3-30B-A3B", 1, True, "ok", 29.11),
    ("Qwen3-235B-A22B", 8, False, "ok", 54.91),
    ("Qwen3-235B-A22B", 8, True, "ok", 27.69),
    ("Qwen3-Next-80B-A3B-Instruct", 2, False, "warn", 74.25),
    ("Qwen3-Next-80B-A3B-Instruct", 2, True, "warn", 37.6),
    ("Qwen3-Next-80B-A3B-Instruct", 4, False, "ok", 37.18),
    ("Qwen3-Next-80B-A3B-Instruct", 4, True, "ok", 18.86),
    ("GLM-4.5-Air", 4, False, "ok", 49.79),
    ("GLM-4.5-Air", 4, True, "ok", 25.24),
    ("GLM-4.7", 8, False, "ok", 82.26),
    ("GLM-4.7", 8, True, "ok", 41.44),
]


@pytest.mark.parametrize(("name", "tp", "int8", "status", "weights"), VERDICTS)
def test_verdicts_at_the_usual_tp(
    tmp_path: Path, name: str, tp: int, int8: bool, status: str, weights: float
) -> None:
    config = w8a8(CONFIGS[name]) if int8 else CONFIGS[name]
    f = _check(tmp_path, config, tp)
    assert f.status == status, f.cause
    assert round(f.details["weights_bytes"] / GIB, 2) == weights
    assert f.details["weights_source"].startswith("estimated from config.json (MoE")
    kind = "W8A8: int8 linears" if int8 else "bfloat16 weights"
    assert kind in f.details["weights_source"]


def test_bf16_weights_are_the_parameters_twice_over_tp_plus_replicas() -> None:
    """Per card at TP 8 (bf16): a little over total x 2 / 8 (routers, norms and the
    K / V heads that TP 8 replicates: 4 KV heads on 8 cards)."""
    est = estimate_moe_weights(CONFIGS["Qwen3-235B-A22B"])
    assert est is not None
    even = est.total_params * 2 / 8
    assert even < est.per_card(8) < even * 1.01


def test_glm_47_bf16_at_tp8_leaves_little_kv(tmp_path: Path) -> None:
    """82 GiB of weights per card: the KV cache holds ~63k tokens, under one request
    of its 202752-token context; the W8A8 checkpoint holds 15x more."""
    bf16 = _check(tmp_path, CONFIGS["GLM-4.7"], 8)
    int8 = _check(tmp_path, w8a8(CONFIGS["GLM-4.7"]), 8)
    assert bf16.details["kv_tokens"] < 202752 < int8.details["kv_tokens"]
    assert int8.details["kv_tokens"] > 10 * bf16.details["kv_tokens"]


def test_qwen3_next_tp2_warns_for_the_state_and_names_the_fix(tmp_path: Path) -> None:
    f = _check(tmp_path, CONFIGS["Qwen3-Next-80B-A3B-Instruct"], 2)
    assert "linear-attention state" in f.cause
    assert "--gpu-memory-utilization 0.88" in f.fix


def test_a_missing_glm_expert_field_is_named(tmp_path: Path) -> None:
    config = dict(CONFIGS["GLM-4.5-Air"])
    del config["n_routed_experts"]
    f = _check(tmp_path, config, 4)
    assert f.status == "fail"
    assert "n_routed_experts is missing" in f.cause
