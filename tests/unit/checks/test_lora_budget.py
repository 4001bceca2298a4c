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


# A Qwen3.5-shaped hybrid: 3 GDN layers then 1 gated full-attention layer.
HYBRID = {
    "text_config": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_num_value_heads": 4,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
    }
}


@pytest.mark.parametrize(("tp", "slots", "r"), [(1, 2, 16), (2, 4, 8)])
def test_a_hybrids_slots_are_counted_per_layer_type(
    tp: int, slots: int, r: int
) -> None:
    h, inter, q, kv, key, value, v_heads, k = 64, 128, 4 * 32, 2 * 32, 32, 64, 4, 4

    def column(i: int, o: int) -> int:
        return r * i + (o // tp) * r

    def row(i: int, o: int) -> int:
        return r * (i // tp) + o * r

    mlp = column(h, inter) * 2 + row(inter, h)
    # q_proj holds the query and its output gate: twice the width.
    full = column(h, 2 * q) + column(h, kv) * 2 + row(q, h)
    # in_proj_qkv (q, k, v slices), in_proj_z, in_proj_b, in_proj_a, out_proj, conv1d
    gdn = (
        column(h, key) * 2
        + column(h, value) * 2
        + column(h, v_heads) * 2
        + row(value, h)
        + column(k, 2 * key + value)
    )
    want = (3 * (gdn + mlp) + full + mlp) * slots * 4
    got = lora_slot_bytes(HYBRID, max_loras=slots, max_rank=r, tp=tp, dtype_bytes=4)
    assert got == want
