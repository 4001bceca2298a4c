"""LoRA adapters written by hand in peft's file layout, for tests, demos and benchmarks.

Why: serving LoRA is checked against transformers with the adapter merged, and timed,
on the tiny checkpoints; peft is not a dependency, and a trained adapter is not needed
to check the arithmetic. The files are what peft writes:

``adapter_config.json`` (peft's keys: ``peft_type``, ``r``, ``lora_alpha``,
``target_modules``, ...) and ``adapter_model.safetensors`` with peft's tensor names,
``base_model.model.<module>.lora_A.weight`` [r, in] and ``.lora_B.weight`` [out, r].
Shapes come from the base checkpoint's own weights, so the adapters fit any Qwen3
dense checkpoint; B is not zero (peft initialises it to zero, a trained adapter's is
not), so an adapter changes the greedy tokens. Serving never imports this module.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def write_adapter(
    directory: Path,
    model_dir: Path,
    *,
    rank: int,
    alpha: float,
    targets: tuple[str, ...] = ATTENTION + MLP,
    seed: int = 0,
    strength: float = 1.0,
    in_features_delta: int = 0,
    out_features_delta: int = 0,
    config_targets: tuple[str, ...] | None = None,
) -> Path:
    """Write one adapter for every layer's ``targets`` of the checkpoint in
    ``model_dir``. ``in_features_delta`` widens every A (a shape that does not match);
    ``out_features_delta`` heightens every B; ``config_targets`` overrides the target list the config states."""
    import torch
    from safetensors.torch import load_file, save_file

    base = load_file(str(model_dir / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for key, weight in sorted(base.items()):
        module = key.removesuffix(".weight")
        if module.rsplit(".", 1)[-1] not in targets or weight.dim() != 2:
            continue
        out_f, in_f = weight.shape
        in_f += in_features_delta
        out_f += out_features_delta
        a = torch.randn(rank, in_f, generator=gen) / math.sqrt(in_f)
        b = torch.randn(out_f, rank, generator=gen) * strength / math.sqrt(rank)
        tensors[f"base_model.model.{module}.lora_A.weight"] = a.contiguous()
        tensors[f"base_model.model.{module}.lora_B.weight"] = b.contiguous()
    if not tensors:  # targets the model lacks: name them as peft would
        for name in targets:
            a = torch.randn(rank, 8, generator=gen)
            b = torch.randn(8, rank, generator=gen)
            tensors[f"base_model.model.model.layers.0.{name}.lora_A.weight"] = a
            tensors[f"base_model.model.model.layers.0.{name}.lora_B.weight"] = b
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "target_modules": list(config_targets or targets),
        "modules_to_save": None,
        "inference_mode": True,
    }
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return directory
