"""The weight and KV budget under pipeline parallelism: each card holds the busiest
stage's share of the layers (vLLM's default partition is an even split), so the
weights, the KV cache per token and the GDN state per sequence shrink with the stages.

The 397B-A17B in bfloat16 does not fit on one host (8 x 96 GiB); on two hosts
(TP 8 x PP 2) it does: the case issue 24 is about.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.checks.qwen3_5_moe_configs import CONFIGS
from vllm_kunlun.checks.budget import check_kv_budget
from vllm_kunlun.checks.finding import Context, Finding
from vllm_kunlun.checks.memory_budget import estimate
from vllm_kunlun.checks.model_shape import ModelShape

GIB = 1 << 30
P800 = 96 * GIB
LOG = {"tensor_parallel_size": 8, "gpu_memory_utilization": 0.75, "max_num_seqs": 256}
# The deployment log's 27B: 64 layers, every fourth full attention.
DENSE_27B = ModelShape(
    model_type="qwen3_5_text",
    num_layers=64,
    linear_layers=48,
    num_kv_heads=4,
    head_dim=256,
    vocab_size=248_320,
    dtype="bfloat16",
    linear_num_key_heads=16,
    linear_num_value_heads=48,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
)


def _check(tmp_path: Path, config: dict[str, Any], **kw: Any) -> Finding:
    d = tmp_path / "models" / "moe"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    ctx = Context(model=str(d), **{**LOG, "device_memory_bytes": P800, **kw})
    return check_kv_budget(ctx)


@pytest.mark.parametrize(
    ("pp", "linear", "attention"), [(1, 48, 16), (2, 24, 8), (3, 16, 6), (5, 10, 4)]
)
def test_a_stage_holds_its_share_of_each_kind_of_layer(
    pp: int, linear: int, attention: int
) -> None:
    stage = DENSE_27B.stage(pp)
    assert (stage.linear_layers, stage.attention_layers) == (linear, attention)


def test_stages_divide_weights_kv_and_state_per_card() -> None:
    args: dict[str, Any] = dict(
        device_bytes=P800, utilization=0.75, tp=8, max_num_seqs=256
    )
    one = estimate(DENSE_27B, weights_bytes=7 * GIB, **args)
    two = estimate(DENSE_27B, weights_bytes=7 * GIB, pp=2, **args)
    assert two.weights_bytes == one.weights_bytes // 2
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token
    assert two.state_bytes * 2 == one.state_bytes
    assert "TP 8 x PP 2" in two.arithmetic()[0]
    assert "PP" not in one.arithmetic()[0]


def test_397b_bf16_fits_on_two_hosts(tmp_path: Path) -> None:
    one = _check(tmp_path, CONFIGS["397B-A17B"])
    two = _check(tmp_path, CONFIGS["397B-A17B"], pipeline_parallel_size=2)
    assert one.status == "fail"
    assert two.status == "ok", two.cause
    assert abs(two.details["weights_bytes"] * 2 - one.details["weights_bytes"]) <= 1
    assert two.details["kv_tokens"] > 262_144  # a full-context request fits


def test_a_full_host_that_does_not_fit_is_told_the_next_stage_count(
    tmp_path: Path,
) -> None:
    # 397B in bfloat16 on 96 GiB cards at PP 2 fits; on 48 GiB cards it needs more.
    f = _check(
        tmp_path,
        CONFIGS["397B-A17B"],
        pipeline_parallel_size=2,
        device_memory_bytes=48 * GIB,
    )
    assert f.status == "fail"
    assert "--pipeline-parallel-size 3" in f.fix
    assert "--distributed-executor-backend ray" in f.fix
