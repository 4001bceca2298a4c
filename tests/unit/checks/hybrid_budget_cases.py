"""The hybrid configs and doctor runs the budget unit tests share (test_budget.py,
test_budget_spec.py): a 27B Qwen3.5-style hybrid text config (48 Gated DeltaNet and 16
full-attention layers) in the flat Qwen3-Next layout and nested in ``text_config`` as
Qwen3.5 writes it, the P800's memory, a model directory holding such a config (with
sparse weights of a given size), and the doctor's KV budget check run on it."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_kunlun.checks.budget import check_kv_budget
from vllm_kunlun.checks.finding import Context, Finding

GIB = 1 << 30
P800 = 96 * GIB  # 103.1 GB

# A 27B hybrid in the style of the log's model: 64 layers, 3 linear-attention (GDN)
# layers per full-attention layer -> 48 GDN + 16 attention layers.
TEXT = {
    "model_type": "qwen3_5_text",
    "vocab_size": 151936,
    "hidden_size": 5120,
    "num_hidden_layers": 64,
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "dtype": "bfloat16",
}
LAYER_TYPES = (["linear_attention"] * 3 + ["full_attention"]) * 16
FLAT = {
    "architectures": ["Qwen3NextForCausalLM"],
    **TEXT,
    "model_type": "qwen3_next",
    "layer_types": LAYER_TYPES,
}
NESTED = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "text_config": TEXT,
}  # no layer_types: transformers' default interval of 4


def write_model_dir(
    tmp_path: Path,
    config: dict,
    weights_bytes: int = 28_000_000_000,
    name: str = "Qwen3.8-27B-W8A8-INT8-Dynamic",
) -> str:
    """``config.json`` and a sparse ``model.safetensors`` of ``weights_bytes`` (none
    at 0) in ``tmp_path/models/name``."""
    d = tmp_path / "models" / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))
    if weights_bytes:
        with open(d / "model.safetensors", "wb") as f:  # sparse: no disk used
            f.truncate(weights_bytes)
    return str(d)


def check_budget(model: str, **kw: object) -> Finding:
    ctx = Context(model=model, device_memory_bytes=P800, **kw)  # type: ignore[arg-type]
    return check_kv_budget(ctx)
