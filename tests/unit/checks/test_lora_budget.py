"""The LoRA slots in the memory budget (vllm_kunlun/checks/lora_budget.py), by hand
arithmetic here; the e2e test (tests/integration/test_e2e_lora.py) compares the same
function with the bytes vLLM really allocates at TP 1 and TP 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_kunlun.checks.budget import check_kv_budget
from vllm_kunlun.checks.finding import Context
from vllm_kunlun.checks.lora_budget import lora_slot_bytes

GIB = 1 << 30
# Qwen3-8B's dimensions (its config.json).
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_hidden_layers": 36,
    "vocab_size": 151936,
    "torch_dtype": "bfloat16",
}


def by_hand(tp: int, slots: int, r: int, dtype_bytes: int) -> int:
    h, inter, q, kv = 4096, 12288, 32 * 128, 8 * 128
    # column parallel (A whole, B / tp): q, k, v, gate, up; row parallel (A / tp,
    # B whole): o, down.
    column = sum(r * h + (out // tp) * r for out in (q, kv, kv, inter, inter))
    row = (r * (q // tp) + h * r) + (r * (inter // tp) + h * r)
    return (column + row) * 36 * slots * dtype_bytes


@pytest.mark.parametrize(("tp", "slots", "r"), [(1, 4, 64), (2, 4, 64), (8, 2, 16)])
def test_slot_bytes_match_the_hand_arithmetic(tp: int, slots: int, r: int) -> None:
    got = lora_slot_bytes(QWEN3_8B, max_loras=slots, max_rank=r, tp=tp, dtype_bytes=2)
    assert got == by_hand(tp, slots, r, 2)


def test_a_config_without_the_dimensions_counts_nothing() -> None:
    assert lora_slot_bytes({}, max_loras=4, max_rank=16, tp=1, dtype_bytes=2) == 0


def test_the_doctors_budget_adds_the_slots_to_the_weights(tmp_path: Path) -> None:
    model = tmp_path / "qwen3-8b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN3_8B))
    with open(model / "model.safetensors", "wb") as f:  # sparse: no disk used
        f.truncate(16 * GIB)
    plain = check_kv_budget(Context(model=str(model), device_memory_bytes=96 * GIB))
    lora = check_kv_budget(
        Context(
            model=str(model),
            device_memory_bytes=96 * GIB,
            max_loras=4,
            max_lora_rank=64,
        )
    )
    extra = lora.details["weights_bytes"] - plain.details["weights_bytes"]
    assert extra == by_hand(1, 4, 64, 2)
    assert "4 LoRA slot(s) of rank 64" in lora.details["arithmetic"][2]
