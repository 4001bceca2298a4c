"""The float64 reference for the W4A16 end-to-end tests (e2e_runner's ``post`` hook).

transformers' own Qwen3 modeling code in float64, each quantized linear layer's weight
decompressed by compressed-tensors' own ``PackedQuantizationCompressor`` (unpack,
subtract the zero point, times the scale) with float64 scales; activations are not
quantized (W4A16), so the engine differs from it by float32 rounding only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

try:  # imported by the tests
    from tests.integration.w8a8_reference import greedy, teacher_forced
except ImportError:  # run by e2e_runner, next to it
    from w8a8_reference import greedy, teacher_forced  # type: ignore[no-redef]
from vllm_kunlun.demo.tiny_int4 import dequantize, layer_args


def float64_reference(model_dir: str) -> torch.nn.Module:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = json.loads((Path(model_dir) / "config.json").read_text())
    quant = raw.pop("quantization_config")
    tensors = load_file(str(Path(model_dir) / "model.safetensors"))
    config = AutoConfig.for_model(**raw)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float64).eval()
    state = {}
    for name, t in tensors.items():
        if name.endswith(".weight_packed"):
            prefix = name.removesuffix(".weight_packed")
            args = layer_args(prefix + ".weight", quant)
            assert args is not None, name
            state[prefix + ".weight"] = dequantize(tensors, prefix, args).double()
        elif not name.endswith(("_scale", "_shape", "_zero_point")):
            state[name] = t.double()
    model.load_state_dict(state, strict=True)
    return model


def post(spec: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    ref = float64_reference(spec["model"])
    out: dict[str, Any] = {"float64_greedy": {}, "float64": {}}
    for name, rows in result["jobs"].items():
        out["float64_greedy"][name] = [
            greedy(ref, r["prompt_token_ids"], len(r["token_ids"])) for r in rows
        ]
        out["float64"][name] = [
            teacher_forced(ref, r["prompt_token_ids"], r["token_ids"]) for r in rows
        ]
    return out
