"""The three released Qwen3.5-MoE configs (35B-A3B, 122B-A10B, 397B-A17B), the fields
the doctor's budget reads, as fixtures; and ``python -m
tests.unit.checks.qwen3_5_moe_configs DIR`` writes each (bfloat16 and W8A8-INT8) as
``DIR/<name>/config.json`` for the doctor runs in docs/models.md.

Where the values come from (public copies of the configs, read 2026-12). The text
model's values are facts read from them; the vision tower's are marked below:

- all three: ``vocab_size`` 248320, ``head_dim`` 256, ``num_key_value_heads`` 2,
  ``full_attention_interval`` 4 (3 Gated DeltaNet layers, then one full-attention
  layer), GDN key / value head dim 128, conv kernel 4, untied embeddings: the
  Megatron argument files in the GitHub repository THUDM/slime (its scripts folder,
  ``models/qwen3.5-35B-A3B.sh`` and ``models/qwen3.5-397B-A17B.sh``) and in its
  forks Aphoh/slime and Osmosis-AI/miles (``models/qwen3.5-122B-A10B.sh``).
- 35B-A3B: hidden 2048, 40 layers, 16 heads, GDN 16 key / 32 value heads, 256
  experts, top-8, ``moe_intermediate_size`` 512, shared expert 512 (slime's 35B-A3B
  file; transformers 5.2.0's ``Qwen3_5MoeTextConfig`` defaults, which its docstring
  calls Qwen3.5-35B-A3B's, agree).
- 122B-A10B: hidden 3072, 48 layers, 32 heads, GDN 16 key / 64 value heads, 256
  experts, top-8, ``moe_intermediate_size`` 1024, shared expert 1024 (the slime
  forks' 122B-A10B file; the GDN heads from a public Ascend test script that serves
  Qwen3.5-122B-A10B with ``linear_num_key_heads`` 16 / ``linear_num_value_heads``
  64, which also repeats the other values).
- 397B-A17B: hidden 4096, 60 layers, 32 heads, GDN 16 key / 64 value heads, 512
  experts, top-10, ``moe_intermediate_size`` 1024, shared expert 1024 (slime's
  397B-A17B file; the GDN heads from a public GDN walkthrough quoting
  huggingface.co/Qwen/Qwen3.5-397B-A17B/blob/main/config.json and from the
  mlx-community/Qwen3.5-397B-A17B-4bit model card; two independent public config
  copies agree on all of it). One Megatron-Bridge unit-test "sample" config says
  shared expert 4096; the published total rules that out (it would make 399.1B).
- vision tower: depth 27, hidden 1152, intermediate 4304, 16 heads, patch 16,
  temporal patch 2, spatial merge 2, 2304 position embeddings are transformers
  5.2.0's ``Qwen3_5MoeVisionConfig`` defaults, which a public analysis of the 397B
  checkpoint's config.json repeats; for 35B and 122B they are assumed the same, and
  ``out_hidden_size`` is assumed to be the text hidden size (the merger feeds the
  language model). Not verified, and they only move the vision count (~0.45B
  parameters), which the per-card weights leave out: the plugin does not load the
  vision tower.
- the MTP head (``mtp_num_hidden_layers`` 1) is not loaded by the plugin and not
  counted.

Published totals (model names and cards): 35B, 122B (122.11B text-only in a GGUF
card), 397B parameters. ``test_budget_moe.py`` checks the parameter
count against them.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

PUBLISHED_TOTAL_PARAMS = {"35B-A3B": 35e9, "122B-A10B": 122e9, "397B-A17B": 397e9}


def _config(
    hidden: int,
    layers: int,
    heads: int,
    linear_value_heads: int,
    experts: int,
    top_k: int,
    moe_inter: int,
    shared_inter: int,
) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "tie_word_embeddings": False,
        "text_config": {
            "model_type": "qwen3_5_moe_text",
            "dtype": "bfloat16",
            "vocab_size": 248320,
            "hidden_size": hidden,
            "num_hidden_layers": layers,
            "full_attention_interval": 4,
            "layer_types": (["linear_attention"] * 3 + ["full_attention"])
            * (layers // 4),
            "num_attention_heads": heads,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": linear_value_heads,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "num_experts": experts,
            "num_experts_per_tok": top_k,
            "moe_intermediate_size": moe_inter,
            "shared_expert_intermediate_size": shared_inter,
            "mtp_num_hidden_layers": 1,
            "tie_word_embeddings": False,
        },
        "vision_config": {
            "depth": 27,
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "num_heads": 16,
            "in_channels": 3,
            "patch_size": 16,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
            "out_hidden_size": hidden,
            "num_position_embeddings": 2304,
        },
    }


CONFIGS: dict[str, dict[str, Any]] = {
    "35B-A3B": _config(2048, 40, 16, 32, 256, 8, 512, 512),
    "122B-A10B": _config(3072, 48, 32, 64, 256, 8, 1024, 1024),
    "397B-A17B": _config(4096, 60, 32, 64, 512, 10, 1024, 1024),
}

# What real W8A8-INT8 (compressed-tensors, int8 per-channel weights, dynamic per-token
# activations) Qwen3.5-MoE checkpoints keep in bfloat16: the lm_head, the routers, the
# shared-expert gates, the vision tower and the MTP head (embeddings and norms are not
# linears, so never quantized).
W8A8_IGNORE = [
    "lm_head",
    "re:.*mlp[.]gate$",
    "re:.*mlp[.]shared_expert_gate$",
    "re:.*visual.*",
    "re:.*mtp.*",
]


def w8a8(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` as its W8A8-INT8 checkpoint's config.json has it."""

    def args(strategy: str, dynamic: bool) -> dict[str, Any]:
        return {
            "num_bits": 8,
            "type": "int",
            "symmetric": True,
            "strategy": strategy,
            "dynamic": dynamic,
        }

    out = copy.deepcopy(config)
    out["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": args("channel", False),
                "input_activations": args("token", True),
            }
        },
        "ignore": list(W8A8_IGNORE),
    }
    return out


def variants() -> dict[str, dict[str, Any]]:
    """``Qwen3.5-<size>`` (bfloat16) and ``Qwen3.5-<size>-W8A8`` configs."""
    out: dict[str, dict[str, Any]] = {}
    for name, config in CONFIGS.items():
        out[f"Qwen3.5-{name}"] = config
        out[f"Qwen3.5-{name}-W8A8"] = w8a8(config)
    return out


def write(root: Path) -> list[Path]:
    """One directory per variant under ``root``, each holding only config.json."""
    dirs = []
    for name, config in variants().items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        dirs.append(d)
    return dirs


if __name__ == "__main__":
    for d in write(Path(sys.argv[1] if len(sys.argv) > 1 else "moe-configs")):
        print(d)
