"""Broken tiny checkpoints: the plugin's tiny writers, then one tensor or the config
changed, as a bad export or a partial download leaves them.

Each case: a writer, the changes, and what the refusal must name. Used by
test_checkpoint_guard.py (vLLM's real loader in one interpreter) and
test_checkpoint_guard_engine.py (real engine starts).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_kunlun.demo.tiny_model import write_tiny_model
from vllm_kunlun.demo.tiny_quant import write_tiny_w8a8
from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec
from vllm_kunlun.demo.tiny_qwen3_5_moe import TinyQwen3_5MoeSpec

WEIGHTS = "model.safetensors"


def _qwen3(d: Path) -> Path:
    return write_tiny_model(d)


def _qwen3_5(d: Path) -> Path:
    return write_tiny_model(d, TinyQwen3_5Spec())


def _qwen3_5_composite(d: Path) -> Path:
    return write_tiny_model(d, TinyQwen3_5Spec(layout="composite"))


def _w8a8(d: Path) -> Path:
    return write_tiny_w8a8(d)


def _awq(d: Path) -> Path:
    from vllm_kunlun.demo.tiny_int4 import write_tiny_awq

    return write_tiny_awq(d)


def _gptq(d: Path) -> Path:
    from vllm_kunlun.demo.tiny_int4 import write_tiny_gptq

    return write_tiny_gptq(d)


def _w4a16(d: Path) -> Path:
    from vllm_kunlun.demo.tiny_int4 import write_tiny_w4a16

    return write_tiny_w4a16(d)


def _qwen3_5_moe(d: Path) -> Path:
    return write_tiny_model(d, TinyQwen3_5MoeSpec())


def _qwen3_5_moe_w8a8(d: Path) -> Path:
    return write_tiny_w8a8(d, TinyQwen3_5MoeSpec(layout="composite"))


WRITERS: dict[str, Callable[[Path], Path]] = {
    "qwen3": _qwen3,
    "qwen3_5": _qwen3_5,
    "qwen3_5_composite": _qwen3_5_composite,
    "w8a8": _w8a8,
    "qwen3_5_moe": _qwen3_5_moe,
    "qwen3_5_moe_w8a8": _qwen3_5_moe_w8a8,
    "awq": _awq,
    "gptq": _gptq,
    "w4a16": _w4a16,
}
# vLLM serves AWQ and GPTQ in float16 only; everything else loads in float32.
FLOAT16_WRITERS = ("awq", "gptq")

FP8_CONFIG = {"quant_method": "fp8", "activation_scheme": "dynamic"}


def _ct_fp8_config() -> dict[str, Any]:
    """compressed-tensors with FP8 weights and activations (llm-compressor's FP8)."""
    from vllm_kunlun.demo.tiny_quant import w8a8_dynamic_config

    config = w8a8_dynamic_config(["lm_head"])
    group = config["config_groups"]["group_0"]
    group["weights"]["type"] = "float"
    group["input_activations"]["type"] = "float"
    config["format"] = "float-quantized"
    return config


@dataclass(frozen=True)
class Case:
    """``writer``'s checkpoint with ``drop`` deleted, each ``rows`` tensor grown
    (or shrunk) by that many rows, each ``shape`` tensor replaced by zeros of that
    shape, and the config's ``quantization_config`` set to ``quant``."""

    writer: str
    drop: tuple[str, ...] = ()
    rows: dict[str, int] = field(default_factory=dict)
    shape: dict[str, tuple[int, ...]] = field(default_factory=dict)
    quant: dict[str, Any] | None = None
    config: dict[str, Any] = field(default_factory=dict)
    text_config: dict[str, Any] = field(default_factory=dict)  # merged into it
    # What the refusal must say (each string), or () for a checkpoint that must load.
    expect: tuple[str, ...] = ()


CASES: dict[str, Case] = {
    # --- untouched (or legitimately partial) checkpoints: must load -------------------
    "qwen3_ok": Case("qwen3"),
    "w8a8_ok": Case("w8a8"),
    "qwen3_5_ok": Case("qwen3_5"),
    "qwen3_5_composite_ok": Case("qwen3_5_composite"),
    # Tied embeddings: no lm_head tensor, and none is needed.
    "qwen3_tied_ok": Case(
        "qwen3", drop=("lm_head.weight",), config={"tie_word_embeddings": True}
    ),
    # A composite whose two flags disagree: transformers 5.2.0 ties by the top level
    # (issue 40, item 12; models/text_config_compat.py), and so must the plugin.
    "qwen3_5_composite_tied_on_top_ok": Case(
        "qwen3_5_composite",
        drop=("lm_head.weight",),
        config={"tie_word_embeddings": True},
        text_config={"tie_word_embeddings": False},
    ),
    "qwen3_5_composite_tied_in_text_only_ok": Case(
        "qwen3_5_composite",
        config={"tie_word_embeddings": False},
        text_config={"tie_word_embeddings": True},
    ),
    # --- the rows --------------------------------------------------------------
    "w8a8_missing_scale": Case(
        "w8a8",
        drop=("model.layers.1.mlp.down_proj.weight_scale",),
        expect=("not initialized", "model.layers.1.mlp.down_proj.weight_scale"),
    ),
    # One shard's scale of a merged parameter: vLLM's own name check would pass it.
    "w8a8_missing_shard_scale": Case(
        "w8a8",
        drop=("model.layers.0.self_attn.k_proj.weight_scale",),
        expect=("model.layers.0.self_attn.qkv_proj.weight_scale (shard 'k')",),
    ),
    "w8a8_scale_3x3": Case(
        "w8a8",
        shape={"model.layers.0.mlp.gate_proj.weight_scale": (3, 3)},
        expect=(
            "'model.layers.0.mlp.gate_proj.weight_scale'",
            "model.layers.0.mlp.gate_up_proj.weight_scale",
            "expected shape [128, 1], found [3, 3]",
        ),
    ),
    "qwen3_q_proj_8_extra": Case(
        "qwen3",
        rows={"model.layers.0.self_attn.q_proj.weight": 8},
        expect=(
            "'model.layers.0.self_attn.q_proj.weight'",
            "model.layers.0.self_attn.qkv_proj.weight",
            "expected shape [128, 64], found [136, 64]",
        ),
    ),
    "qwen3_5_in_proj_a_3_extra": Case(
        "qwen3_5",
        rows={"model.layers.0.linear_attn.in_proj_a.weight": 3},
        expect=(
            "'model.layers.0.linear_attn.in_proj_a.weight'",
            "model.layers.0.linear_attn.in_proj_ba.weight",
            "expected shape [4, 64], found [7, 64]",
        ),
    ),
    "qwen3_5_in_proj_b_one_short": Case(
        "qwen3_5",
        rows={"model.layers.1.linear_attn.in_proj_b.weight": -1},
        expect=(
            "'model.layers.1.linear_attn.in_proj_b.weight'",
            "expected shape [4, 64], found [3, 64]",
        ),
    ),
    "qwen3_5_A_log_one_short": Case(
        "qwen3_5",
        rows={"model.layers.2.linear_attn.A_log": -1},
        expect=(
            "'model.layers.2.linear_attn.A_log'",
            "expected shape [4], found [3]",
        ),
    ),
    "qwen3_5_composite_conv_extra": Case(
        "qwen3_5_composite",
        rows={"model.language_model.layers.0.linear_attn.conv1d.weight": 2},
        expect=(
            "'model.language_model.layers.0.linear_attn.conv1d.weight'",
            "expected shape [128, 1, 4], found [130, 1, 4]",
        ),
    ),
    "qwen3_missing_k_proj": Case(
        "qwen3",
        drop=("model.layers.1.self_attn.k_proj.weight",),
        expect=("model.layers.1.self_attn.qkv_proj.weight (shard 'k')",),
    ),
    "qwen3_embed_extra": Case(
        "qwen3",
        rows={"model.embed_tokens.weight": 5},
        expect=("'model.embed_tokens.weight'", "found ["),
    ),
    # A plain parameter (default_weight_loader): vLLM's assert names no tensor.
    "qwen3_norm_extra": Case(
        "qwen3",
        rows={"model.layers.0.input_layernorm.weight": 1},
        expect=("'model.layers.0.input_layernorm.weight'", "found [65]"),
    ),
    # --- Qwen3.5-MoE: the experts load through the model's own loader ------------------
    "qwen3_5_moe_ok": Case("qwen3_5_moe"),
    "qwen3_5_moe_w8a8_ok": Case("qwen3_5_moe_w8a8"),
    "qwen3_5_moe_missing_expert": Case(
        "qwen3_5_moe",
        drop=("model.layers.2.mlp.experts.5.up_proj.weight",),
        expect=(
            "lacks expert tensors",
            "model.layers.2.mlp.experts.5.up_proj.weight",
            "8 experts per layer",
        ),
    ),
    # A config that says 6 experts for a checkpoint of 8.
    "qwen3_5_moe_expert_count": Case(
        "qwen3_5_moe",
        config={"num_experts": 6},
        expect=("'model.layers.0.mlp.experts.6.", "num_experts=6"),
    ),
    "qwen3_5_moe_expert_rows": Case(
        "qwen3_5_moe",
        rows={"model.layers.1.mlp.experts.0.down_proj.weight": 2},
        expect=(
            "'model.layers.1.mlp.experts.0.down_proj.weight'",
            "shape [66, 32]",
            "needs [64, 32]",
        ),
    ),
    "qwen3_5_moe_w8a8_missing_expert_scale": Case(
        "qwen3_5_moe_w8a8",
        drop=("model.language_model.layers.3.mlp.experts.1.gate_proj.weight_scale",),
        expect=("model.layers.3.mlp.experts.1.gate_proj.weight_scale",),
    ),
    "fp8_config": Case(
        "qwen3",
        quant=FP8_CONFIG,
        expect=("fp8 quantization cannot run", "compressed-tensors W8A8-INT8"),
    ),
    # --- 4-bit weight-only checkpoints --------------------------------------------------
    "awq_ok": Case("awq"),
    "gptq_ok": Case("gptq"),
    "w4a16_ok": Case("w4a16"),
    "awq_missing_scales": Case(
        "awq",
        drop=("model.layers.1.mlp.down_proj.scales",),
        expect=("model.layers.1.mlp.down_proj.scales",),
    ),
    # qzeros of the wrong width: [groups, out / 8] with out doubled
    "awq_qzeros_wrong_width": Case(
        "awq",
        shape={"model.layers.0.mlp.down_proj.qzeros": (4, 16)},
        expect=("model.layers.0.mlp.down_proj.qzeros", "[4, 16]"),
    ),
    # a GPTQ weight left unpacked: [in, out] instead of [in / 8, out]
    "gptq_qweight_unpacked": Case(
        "gptq",
        shape={"model.layers.0.self_attn.o_proj.qweight": (128, 64)},
        expect=("model.layers.0.self_attn.o_proj.qweight", "[128, 64]"),
    ),
    "w4a16_missing_zero_point": Case(
        "w4a16",
        drop=("model.layers.1.mlp.up_proj.weight_zero_point",),
        expect=("model.layers.1.mlp.gate_up_proj.weight_zero_point",),
    ),
    "ct_fp8_scheme": Case(
        "qwen3",
        quant=_ct_fp8_config(),
        expect=("8-bit float", "compressed-tensors W8A8-INT8"),
    ),
}


def write_case(case: Case, directory: Path) -> Path:
    """Write ``case``'s checkpoint into ``directory`` (a fresh path)."""
    import torch
    from safetensors.torch import load_file, save_file

    out = WRITERS[case.writer](directory)
    tensors = load_file(str(out / WEIGHTS))
    for name in (*case.drop, *case.rows, *case.shape):
        if name not in tensors:
            raise KeyError(f"{name} is not a tensor of the {case.writer} checkpoint")
    for name in case.drop:
        del tensors[name]
    for name, delta in case.rows.items():
        t = tensors[name]
        if delta >= 0:
            extra = torch.zeros((delta, *t.shape[1:]), dtype=t.dtype)
            tensors[name] = torch.cat([t, extra]).contiguous()
        else:
            tensors[name] = t[:delta].contiguous()
    for name, shape in case.shape.items():
        tensors[name] = torch.zeros(shape, dtype=tensors[name].dtype)
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    if case.quant is not None or case.config or case.text_config:
        path = out / "config.json"
        config = json.loads(path.read_text())
        config.update(case.config)
        config.get("text_config", {}).update(case.text_config)
        if case.quant is not None:
            config["quantization_config"] = case.quant
        path.write_text(json.dumps(config, indent=2))
    return out
