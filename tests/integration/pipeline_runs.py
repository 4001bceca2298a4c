"""Helpers the pipeline-parallel tests share (``test_e2e_pp.py``, ``test_e2e_ray.py``):
the six-layer hybrid they split, a tied-head checkpoint, and per-stage layer counts."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec

SIX = TinyQwen3_5Spec(layout="causal", num_hidden_layers=6, full_attention_interval=2)


def tie_lm_head(model: Path) -> Path:
    """The checkpoint with ``lm_head`` tied to the embedding, as small Qwen releases
    ship it: no ``lm_head.weight`` on disk, ``tie_word_embeddings`` in the config."""
    from safetensors.torch import load_file, save_file

    config = json.loads((model / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (model / "config.json").write_text(json.dumps(config, indent=2))
    tensors = load_file(model / "model.safetensors")
    assert tensors.pop("lm_head.weight") is not None
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    return model


def stage_layers(run: dict) -> list[dict[str, int]]:
    """Per worker (rank order), how many layers of each kind its KV cache holds."""
    counts = []
    for info in run["serving"]:
        kinds: Counter[str] = Counter()
        for group in info["kv_blocks"]:
            kinds[group["kind"]] += group["layers"]
        counts.append(dict(kinds))
    return counts
