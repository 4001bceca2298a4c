"""The doctor's weight / KV budget for DeepSeek-V3 (multi-head latent attention):
the KV cache is one latent row per token and layer (``kv_lora_rank + qk_rope_head_dim``,
the same on every TP rank), the weights are counted from the released config.json.

Fixture: ``mla_configs/DeepSeek-V3/config.json``, deepseek-ai/DeepSeek-V3's released
config (published values, as quoted in public copies; FP8 block-quantized weights as
released). The count is checked against transformers 5.2.0's own model on the meta
device and the published 671B; the page against vLLM's own ``MLAAttentionSpec``; the
verdicts are those docs/models.md reports (96 GiB P800 cards,
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
RELEASED = json.loads(
    (Path(__file__).parent / "mla_configs/DeepSeek-V3/config.json").read_text()
)
BF16 = {k: v for k, v in RELEASED.items() if k != "quantization_config"}


def test_parameter_count_is_transformers_own_and_the_published_671b() -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    est = estimate_moe_weights(BF16)
    assert est is not None
    skip = ("architectures", "rope_scaling", "quantization_config")
    hf = AutoConfig.for_model(**{k: v for k, v in BF16.items() if k not in skip})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    buffers = sum(
        b.numel() for n, b in model.named_buffers() if "e_score_correction_bias" in n
    )
    assert est.total_params == sum(p.numel() for p in model.parameters()) + buffers
    assert abs(est.total_params - 671e9) / 671e9 < 0.005


def test_mla_tensors_by_hand() -> None:
    tensors = {t.name: t for t in family_tensors(BF16) or []}
    a = "model.layers.5.self_attn."
    assert tensors[a + "q_a_proj"].rows == 1536
    assert tensors[a + "q_a_proj"].split == "replicated"
    assert tensors[a + "q_b_proj"].rows == 128 * (128 + 64)
    assert tensors[a + "kv_a_proj_with_mqa"].rows == 512 + 64
    assert tensors[a + "kv_b_proj"].rows == 128 * (128 + 128)
    assert tensors[a + "kv_b_proj"].cols == 512
    assert a + "k_proj" not in tensors
    assert "model.layers.2.mlp.gate" not in tensors  # first_k_dense_replace 3
    assert "model.layers.3.mlp.gate.e_score_correction_bias" in tensors
    v2 = dict(BF16, model_type="deepseek_v2", q_lora_rank=None)
    lite = {t.name for t in family_tensors(v2) or []}
    assert a + "q_proj" in lite and a + "q_a_proj" not in lite
    assert "model.layers.3.mlp.gate.e_score_correction_bias" not in lite


@pytest.mark.parametrize(("tp", "pp", "layers"), [(8, 1, 61), (8, 2, 31), (1, 1, 61)])
def test_kv_bytes_per_token_is_the_latent_row_of_every_layer(
    tp: int, pp: int, layers: int
) -> None:
    shape = ModelShape.from_config(BF16)
    assert shape.mla_width == 576
    # 576 bf16 values per token and layer on every card, whatever the TP size.
    assert shape.stage(pp).kv_bytes_per_token(tp) == layers * 576 * 2


@pytest.mark.parametrize(
    "width,rope,dtype", [(576, 64, "bfloat16"), (40, 8, "float32")]
)
def test_page_is_vllms_mla_spec(width: int, rope: int, dtype: str) -> None:
    import torch
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    spec = MLAAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=width, dtype=getattr(torch, dtype)
    )
    shape = ModelShape.from_config(
        dict(BF16, kv_lora_rank=width - rope, qk_rope_head_dim=rope, torch_dtype=dtype)
    )
    assert shape.attention_page_bytes_per_token(8) * 16 == spec.page_size_bytes


def _check(tmp_path: Path, config: dict[str, Any], tp: int, pp: int) -> Finding:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    ctx = Context(
        model=str(d),
        device_memory_bytes=P800,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        gpu_memory_utilization=0.9,
        max_num_seqs=256,
    )
    return check_kv_budget(ctx)


# (weights, TP, PP, status, weights GiB per card, KV bytes per token per card)
VERDICTS = [
    ("bf16", 8, 1, "fail", 157.92, 61 * 1152),
    ("bf16", 8, 2, "ok", 78.96, 31 * 1152),
    ("w8a8", 8, 1, "ok", 79.35, 61 * 1152),
    ("w8a8", 8, 2, "ok", 39.68, 31 * 1152),
]


@pytest.mark.parametrize(("kind", "tp", "pp", "status", "weights", "kv"), VERDICTS)
def test_deepseek_v3_on_p800s(
    tmp_path: Path,
    kind: str,
    tp: int,
    pp: int,
    status: str,
    weights: float,
    kv: int,
) -> None:
    config = w8a8(BF16) if kind == "w8a8" else BF16
    f = _check(tmp_path, config, tp, pp)
    assert f.status == status, f.cause
    assert round(f.details["weights_bytes"] / GIB, 2) == weights
    assert f.details["kv_bytes_per_token"] == kv
    assert f.details["mla_latent_width"] == 576
    assert f.details["attention_backend"].endswith("PluginMLABackend")
    if status == "fail":  # BF16 at TP 8: 158 GiB of weights per 96 GiB card
        assert "W8A8-INT8" in f.fix and "--pipeline-parallel-size 2" in f.fix
    else:
        assert f.details["max_safe_utilization"] == pytest.approx(0.93)


def test_the_released_fp8_config_is_budgeted_as_an_upper_bound(
    tmp_path: Path,
) -> None:
    f = _check(tmp_path, RELEASED, 8, 2)
    assert (
        "'fp8' is not modelled, so this is an upper bound"
        in (f.details["weights_source"])
    )
