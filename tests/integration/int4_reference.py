"""The float64 references for the 4-bit end-to-end tests (e2e_runner's ``post`` hooks).

transformers' own Qwen3 modeling code in float64, each quantized linear layer's weight
dequantized: compressed-tensors checkpoints by compressed-tensors' own
``PackedQuantizationCompressor`` (unpack, subtract the zero point, times the scale)
with float64 scales (``post``); AWQ checkpoints by the AutoAWQ unpacking written out
below (``post_awq``). Activations are not quantized (W4A16), so the engine differs
from the reference by float rounding only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

try:  # imported by the tests
    from tests.integration.w8a8_reference import (
        assert_greedy_matches,
        reference_rows,
    )
except ImportError:  # run by e2e_runner, next to it
    from w8a8_reference import (  # type: ignore[no-redef]
        assert_greedy_matches,
        reference_rows,
    )
from vllm_kunlun.demo.tiny_int4 import dequantize, layer_args


def _float64_model(
    model_dir: str,
    packed_suffix: str,
    drop: tuple[str, ...],
    dequantize_layer: Callable[[dict[str, torch.Tensor], str, dict], torch.Tensor],
) -> torch.nn.Module:
    """transformers' model in float64 with every packed layer replaced by its
    dequantized weight (``dequantize_layer(tensors, prefix, quantization_config)``);
    the quantization side tensors (``drop`` suffixes) are left out."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = json.loads((Path(model_dir) / "config.json").read_text())
    quant = raw.pop("quantization_config")
    tensors = load_file(str(Path(model_dir) / "model.safetensors"))
    config = AutoConfig.for_model(**raw)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float64).eval()
    state = {}
    for name, t in tensors.items():
        if name.endswith(packed_suffix):
            prefix = name.removesuffix(packed_suffix)
            state[prefix + ".weight"] = dequantize_layer(tensors, prefix, quant)
        elif not name.endswith(drop):
            state[name] = t.double()
    model.load_state_dict(state, strict=True)
    return model


def _compressed_layer(
    tensors: dict[str, torch.Tensor], prefix: str, quant: dict
) -> torch.Tensor:
    args = layer_args(prefix + ".weight", quant)
    assert args is not None, prefix
    return dequantize(tensors, prefix, args).double()


def float64_reference(model_dir: str) -> torch.nn.Module:
    return _float64_model(
        model_dir,
        ".weight_packed",
        ("_scale", "_shape", "_zero_point"),
        _compressed_layer,
    )


def post(spec: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    return reference_rows(float64_reference(spec["model"]), result)


# AutoAWQ's GEMM packing, written out here (independently of the plugin's unpacking):
# nibble i of each int32 word holds column 8 * word + ORDER[i].
AWQ_NIBBLE_COLUMNS = (0, 2, 4, 6, 1, 3, 5, 7)


def awq_unpack_reference(packed: torch.Tensor) -> torch.Tensor:
    rows, words = packed.shape
    out = torch.zeros(rows, words * 8, dtype=torch.int64)
    p = packed.to(torch.int64) & 0xFFFFFFFF
    for i, col in enumerate(AWQ_NIBBLE_COLUMNS):
        out[:, col::8] = (p >> (4 * i)) & 0xF
    return out


def awq_dequantize_reference(
    tensors: dict[str, torch.Tensor], prefix: str, group_size: int
) -> torch.Tensor:
    """``[out, in]`` float64: ``(q - zero) * scale`` per group of input rows."""
    q = awq_unpack_reference(tensors[f"{prefix}.qweight"])  # [in, out]
    zeros = awq_unpack_reference(tensors[f"{prefix}.qzeros"])  # [G, out]
    scales = tensors[f"{prefix}.scales"].double()  # [G, out]
    g = torch.arange(q.shape[0]) // group_size
    return ((q - zeros[g]).double() * scales[g]).t().contiguous()


def awq_float64_reference(model_dir: str) -> torch.nn.Module:
    return _float64_model(
        model_dir,
        ".qweight",
        (".qzeros", ".scales"),
        lambda t, p, q: awq_dequantize_reference(t, p, q["group_size"]),
    )


def post_awq(spec: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    return reference_rows(awq_float64_reference(spec["model"]), result)


def gptq_unpack_reference(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """GPTQ's packing read back bit by bit: along ``dim``, value ``f * word + j`` sits
    at shift ``bits * j`` of the word."""
    f = 32 // bits
    p = packed.to(torch.int64) & 0xFFFFFFFF
    parts = [(p >> (bits * j)) & ((1 << bits) - 1) for j in range(f)]
    return torch.stack(parts, dim=dim + 1).flatten(dim, dim + 1)


def gptq_dequantize_reference(
    tensors: dict[str, torch.Tensor], prefix: str, bits: int
) -> torch.Tensor:
    """``[out, in]`` float64: ``(q - (stored zero + 1)) * scale`` of each input row's
    group (``g_idx``), GPTQ v1's convention."""
    q = gptq_unpack_reference(tensors[f"{prefix}.qweight"], bits, 0)  # [in, out]
    zeros = gptq_unpack_reference(tensors[f"{prefix}.qzeros"], bits, 1) + 1  # [G, out]
    scales = tensors[f"{prefix}.scales"].double()
    g = tensors[f"{prefix}.g_idx"].long()
    return ((q - zeros[g]).double() * scales[g]).t().contiguous()


def gptq_float64_reference(model_dir: str) -> torch.nn.Module:
    return _float64_model(
        model_dir,
        ".qweight",
        (".qzeros", ".scales", ".g_idx"),
        lambda t, p, q: gptq_dequantize_reference(t, p, q["bits"]),
    )


def post_gptq(spec: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    return reference_rows(gptq_float64_reference(spec["model"]), result)


def assert_matches_dequantized(run: dict[str, Any], tol: float, misses: int) -> None:
    """The engine's greedy tokens against the float64 dequantized reference (up to
    ``misses`` sequences parting at a near-tie) and every logprob within ``tol``."""
    post = run["post"]
    rows = list(
        zip(
            run["jobs"]["greedy"],
            post["float64_greedy"]["greedy"],
            post["float64"]["greedy"],
            strict=True,
        )
    )
    assert_greedy_matches(rows, misses=misses)
    diffs = [
        abs(a - b)
        for got, _, ref in rows
        for a, b in zip(got["logprobs"], ref["logprobs"], strict=True)
    ]
    assert max(diffs) < tol, max(diffs)
