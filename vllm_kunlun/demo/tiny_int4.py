"""Turn the tiny Qwen3 into a compressed-tensors W4A16 ``pack-quantized`` checkpoint.

Why: the tests, the demo and the benchmarks need a 4-bit weight-only checkpoint without
llm-compressor or a download. How: with compressed-tensors' own tooling, as
llm-compressor writes such checkpoints: the min-max observer's quantization parameters
(``calculate_qparams``) and ``PackedQuantizationCompressor.compress_weight`` (signed
values offset to unsigned, eight 4-bit values per int32 along the input dimension,
zero points packed along the output dimension). The scales are rounded to the model
dtype first, so the stored scale is the one the values were quantized with. Two
config groups cover both strategies in one checkpoint: the attention projections per
group of ``GROUP_SIZE`` input features, symmetric; the MLP projections per output
channel, with zero points. ``lm_head`` stays float. Only torch, safetensors and
compressed-tensors (a vLLM dependency) are needed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm_kunlun.demo.tiny_model import TinyQwen3Spec

ATTENTION = r"model\.layers\.\d+\.self_attn\.\w+_proj\.weight"
MLP = r"model\.layers\.\d+\.mlp\.\w+_proj\.weight"
GROUP_SIZE = 32


def weight_args(strategy: str, symmetric: bool, group_size: int | None) -> dict:
    """4-bit static weight args (compressed-tensors' min-max observer)."""
    from vllm_kunlun.demo.tiny_quant import quant_args

    return quant_args(4, strategy, symmetric, group_size)


def w4a16_config(group_size: int = GROUP_SIZE) -> dict:
    """The ``quantization_config``: attention per group (symmetric), MLP per channel
    (asymmetric), float activations."""
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": [r"re:.*self_attn\.(q|k|v|o)_proj$"],
                "weights": weight_args("group", True, group_size),
                "input_activations": None,
                "output_activations": None,
            },
            "group_1": {
                "targets": [r"re:.*mlp\.(gate|up|down)_proj$"],
                "weights": weight_args("channel", False, None),
                "input_activations": None,
                "output_activations": None,
            },
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "sparsity_config": {},
    }


def compress(w: Any, args_dict: dict, scale_dtype: Any) -> dict[str, Any]:
    """``[out, in]`` float -> compressed-tensors' tensors for one linear layer
    (``weight_packed``, ``weight_shape``, ``weight_scale`` and, asymmetric,
    ``weight_zero_point``), by compressed-tensors' own observer and compressor."""
    from compressed_tensors.compressors import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(**args_dict)
    n, k = w.shape
    groups = k // args.group_size if args.group_size else 1
    wg = w.float().reshape(n, groups, -1)
    scale, zero = calculate_qparams(wg.amin(-1), wg.amax(-1), args)
    scale = scale.to(scale_dtype)
    compressor = PackedQuantizationCompressor.__new__(PackedQuantizationCompressor)
    out = compressor.compress_weight(
        w.float(), scale.float(), args, None if args.symmetric else zero
    )
    out["weight_scale"] = scale
    return out


def dequantize(tensors: dict[str, Any], prefix: str, args_dict: dict) -> Any:
    """compressed-tensors' own decompression of one layer, in float64."""
    from compressed_tensors.compressors import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs

    data = {
        k: tensors[f"{prefix}.{k}"]
        for k in ("weight_packed", "weight_shape", "weight_zero_point")
        if f"{prefix}.{k}" in tensors
    }
    data["weight_scale"] = tensors[f"{prefix}.weight_scale"].double()
    compressor = PackedQuantizationCompressor.__new__(PackedQuantizationCompressor)
    return compressor.decompress_weight(data, QuantizationArgs(**args_dict))


def layer_args(name: str, config: dict) -> dict | None:
    """The weight args of the config group that quantizes ``name`` (a ``.weight``)."""
    import re

    module = name.removesuffix(".weight")
    for group in config["config_groups"].values():
        for target in group["targets"]:
            if re.fullmatch(target.removeprefix("re:"), module):
                return group["weights"]  # type: ignore[no-any-return]
    return None


Quantize = Callable[[str, Any], "dict[str, Any] | None"]


def _rewrite(
    directory: str | os.PathLike[str],
    dtype: str,
    quantizer: Callable[[dict[str, Any], Any], Quantize],
    quant_config: dict,
    label: str,
    spec: TinyQwen3Spec | None = None,
) -> Path:
    """The tiny Qwen3 written to ``directory`` and quantized in place, the one loop
    every format here shares: ``quantizer(weights, float dtype)`` gives the function
    that turns a ``.weight`` into the layer's tensors (None: it stays float, in
    ``dtype``); ``quant_config`` and ``torch_dtype`` go into config.json, ``label`` into
    the marker, written last (the checkpoint is complete again only once quantized)."""
    import torch
    from safetensors.torch import load_file, save

    from vllm_kunlun.demo.tiny_model import (
        MARKER,
        TinyQwen3Spec,
        write_atomic,
        write_tiny_model,
    )

    spec = spec or TinyQwen3Spec()
    out = write_tiny_model(directory, spec)
    (out / MARKER).unlink()  # complete again only once quantized
    config = json.loads((out / "config.json").read_text())
    float_dtype = getattr(torch, dtype)
    weights = load_file(str(out / "model.safetensors"))
    quantize = quantizer(weights, float_dtype)
    result = {}
    for name, t in weights.items():
        tensors = quantize(name, t)
        if tensors is None:
            result[name] = t.to(float_dtype) if t.is_floating_point() else t
            continue
        prefix = name.removesuffix(".weight")
        for key, value in tensors.items():
            result[f"{prefix}.{key}"] = value
    config["quantization_config"] = quant_config
    config["torch_dtype"] = dtype
    write_atomic(out / "model.safetensors", save(result, metadata={"format": "pt"}))
    write_atomic(
        out / "config.json",
        (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(),
    )
    marker = {**spec.marker(), "quant": label}
    write_atomic(out / MARKER, (json.dumps(marker, sort_keys=True) + "\n").encode())
    return out


def _projection(name: str) -> bool:
    """An attention or MLP projection's weight (the AWQ / GPTQ writers quantize it)."""
    import re

    return bool(re.fullmatch(ATTENTION, name) or re.fullmatch(MLP, name))


def write_tiny_w4a16(
    directory: str | os.PathLike[str],
    dtype: str = "float32",
    group_size: int = GROUP_SIZE,
    spec: TinyQwen3Spec | None = None,
) -> Path:
    """The tiny Qwen3 (``spec``: another shape) written to ``directory`` and quantized to W4A16 in place; the
    model dtype (``torch_dtype``) and the scales' dtype are ``dtype``."""
    quant = w4a16_config(group_size)

    def quantizer(weights: dict[str, Any], scale_dtype: Any) -> Quantize:
        def quantize(name: str, t: Any) -> dict[str, Any] | None:
            args = layer_args(name, quant)
            return None if args is None else compress(t, args, scale_dtype)

        return quantize

    return _rewrite(
        directory, dtype, quantizer, quant, f"w4a16-{dtype}-g{group_size}", spec
    )


# ---- AWQ (AutoAWQ's GEMM checkpoints) ------------------------------------------------

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""AutoAWQ's GEMM packing: nibble ``i`` of a word holds column ``8 w + AWQ_ORDER[i]``."""


def awq_config(group_size: int = GROUP_SIZE) -> dict:
    return {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group_size,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": None,
    }


def awq_pack(values: Any) -> Any:
    """``[R, C]`` unsigned 4-bit values -> ``[R, C / 8]`` int32, AutoAWQ's order."""
    import torch

    v = values.to(torch.int64).reshape(values.shape[0], -1, 8)
    word = torch.zeros(v.shape[:2], dtype=torch.int64)
    for i, col in enumerate(AWQ_ORDER):
        word |= v[..., col] << (4 * i)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def awq_quantize(w: Any, group_size: int, scale_dtype: Any) -> dict[str, Any]:
    """``[out, in]`` float -> AutoAWQ's ``qweight`` ``[in, out/8]``, ``qzeros``
    ``[G, out/8]``, ``scales`` ``[G, out]`` (its ``pseudo_quantize_tensor`` with zero
    points: ``scale = (max - min) / 15``, ``zero = clamp(-rne(min / scale), 0, 15)``,
    ``q = clamp(rne(w / scale) + zero, 0, 15)``, with the stored scale)."""
    import torch

    n, k = w.shape
    wg = w.double().reshape(n, k // group_size, group_size)
    hi, lo = wg.amax(-1), wg.amin(-1)
    scales = ((hi - lo).clamp(min=1e-5) / 15).to(scale_dtype)
    s = scales.double()
    zeros = (-torch.round(lo / s)).clamp(0, 15)
    q = (torch.round(wg / s.unsqueeze(-1)) + zeros.unsqueeze(-1)).clamp(0, 15)
    q = q.reshape(n, k).to(torch.int32)
    return {
        "qweight": awq_pack(q.t().contiguous()),
        "qzeros": awq_pack(zeros.t().contiguous().to(torch.int32)),
        "scales": scales.t().contiguous(),
    }


def write_tiny_awq(
    directory: str | os.PathLike[str],
    dtype: str = "float16",
    group_size: int = GROUP_SIZE,
    spec: TinyQwen3Spec | None = None,
) -> Path:
    """The tiny Qwen3 (``spec``: another shape) written to ``directory`` as an AWQ GEMM checkpoint: every
    attention and MLP projection 4-bit with zero points per group; the rest float in
    ``dtype`` (vLLM serves AWQ in float16 only)."""

    def quantizer(weights: dict[str, Any], float_dtype: Any) -> Quantize:
        def quantize(name: str, t: Any) -> dict[str, Any] | None:
            if not _projection(name):
                return None
            return awq_quantize(t, group_size, float_dtype)

        return quantize

    config = awq_config(group_size)
    return _rewrite(
        directory, dtype, quantizer, config, f"awq-{dtype}-g{group_size}", spec
    )


# ---- GPTQ (GPTQ / AutoGPTQ checkpoints, v1 zero points) -------------------------------


def gptq_config(bits: int, group_size: int, desc_act: bool, sym: bool) -> dict:
    return {
        "quant_method": "gptq",
        "bits": bits,
        "group_size": group_size,
        "desc_act": desc_act,
        "sym": sym,
        "checkpoint_format": "gptq",
        "lm_head": False,
    }


def pack_rows(values: Any, bits: int) -> Any:
    """``[R, C]`` unsigned values -> ``[R / f, C]`` int32, packed along the rows
    (GPTQ's ``qweight``: value ``f i + j`` of a column at shift ``bits j``)."""
    import torch

    f = 32 // bits
    v = values.to(torch.int64).reshape(-1, f, values.shape[1])
    word = torch.zeros(v.shape[0], v.shape[2], dtype=torch.int64)
    for j in range(f):
        word |= (v[:, j] & ((1 << bits) - 1)) << (bits * j)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def gptq_quantize(
    w: Any,
    bits: int,
    group_size: int,
    desc_act: bool,
    sym: bool,
    scale_dtype: Any,
    order: Any = None,
) -> dict[str, Any]:
    """``[out, in]`` float -> GPTQ's ``qweight`` ``[in/f, out]``, ``qzeros``
    ``[G, out/f]`` (``zero - 1``, v1), ``scales`` ``[G, out]``, ``g_idx`` ``[in]``.

    GPTQ's quantizer per group (round to nearest, no Hessian update): the range
    widened to include 0, symmetric ``max(|min|, max)`` with the zero point at the
    midpoint, ``scale = (max - min) / (2^bits - 1)``, ``q = clamp(rne(w / scale) +
    zero, 0, 2^bits - 1)``. ``desc_act``: columns are taken in ``order`` (default:
    largest norm first, standing in for the Hessian's diagonal, which layers fed the
    same input share) and ``g_idx`` names each column's group, the weight staying in
    its own column order, as GPTQ stores it."""
    import torch

    n, k = w.shape
    maxq = (1 << bits) - 1
    w64 = w.double()
    if not desc_act:
        order = torch.arange(k)
    elif order is None:
        order = torch.argsort(w64.norm(dim=0), descending=True, stable=True)
    g_idx = torch.empty(k, dtype=torch.int64)
    g_idx[order] = torch.arange(k) // group_size
    groups = k // group_size
    scales = torch.empty(groups, n, dtype=torch.float64)
    zeros = torch.empty(groups, n, dtype=torch.float64)
    for g in range(groups):
        cols = w64[:, g_idx == g]
        lo = cols.amin(dim=1).clamp(max=0)
        hi = cols.amax(dim=1).clamp(min=0)
        if sym:
            hi = torch.maximum(lo.abs(), hi)
            lo = -hi
        scale = ((hi - lo) / maxq).clamp(min=1e-8).to(scale_dtype).double()
        scales[g] = scale
        zeros[g] = (
            torch.full_like(scale, (maxq + 1) // 2) if sym else torch.round(-lo / scale)
        )
    s_col, z_col = scales[g_idx].t(), zeros[g_idx].t()  # [out, in]
    q = (torch.round(w64 / s_col) + z_col).clamp(0, maxq).to(torch.int64)
    return {
        "qweight": pack_rows(q.t().contiguous(), bits),
        "qzeros": pack_rows((zeros.to(torch.int64) - 1).t().contiguous(), bits)
        .t()
        .contiguous(),
        "scales": scales.to(scale_dtype),
        "g_idx": g_idx.to(torch.int32),
    }


def write_tiny_gptq(
    directory: str | os.PathLike[str],
    bits: int = 4,
    group_size: int = GROUP_SIZE,
    desc_act: bool = True,
    sym: bool = False,
    dtype: str = "float16",
    spec: TinyQwen3Spec | None = None,
) -> Path:
    """The tiny Qwen3 (``spec``: another shape) written to ``directory`` as a GPTQ checkpoint: every attention
    and MLP projection quantized by ``gptq_quantize``; the rest float in ``dtype``
    (vLLM serves GPTQ in float16 only)."""
    import re

    import torch

    def shared_input(name: str) -> str:
        # q / k / v read the same input, as do gate / up: one Hessian, one order
        return re.sub(
            r"\.(q|k|v)_proj\.",
            ".qkv.",
            re.sub(r"\.(gate|up)_proj\.", ".gate_up.", name),
        )

    def quantizer(weights: dict[str, Any], float_dtype: Any) -> Quantize:
        norms: dict[str, Any] = {}
        for name, t in weights.items():
            if _projection(name):
                key = shared_input(name)
                norms[key] = norms.get(key, 0) + t.double().pow(2).sum(dim=0)

        def quantize(name: str, t: Any) -> dict[str, Any] | None:
            if not _projection(name):
                return None
            order = torch.argsort(
                norms[shared_input(name)], descending=True, stable=True
            )
            return gptq_quantize(t, bits, group_size, desc_act, sym, float_dtype, order)

        return quantize

    config = gptq_config(bits, group_size, desc_act, sym)
    label = f"gptq-{bits}bit-g{group_size}-{'act' if desc_act else 'seq'}-{sym}"
    return _rewrite(directory, dtype, quantizer, config, label, spec)
