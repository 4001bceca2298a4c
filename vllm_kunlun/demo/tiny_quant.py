"""Turn a written checkpoint into a compressed-tensors W8A8-INT8 (dynamic) checkpoint.

Why: the log's model is ``...-W8A8-INT8-Dynamic`` (llm-compressor's W8A8 preset). The
tests, the demo and the benchmarks need such a checkpoint without llm-compressor or a
download, for the tiny Qwen3 and for any other tiny model the project writes.
How: model-agnostic. The caller names the linear weights to quantize (``[out, in]``
float tensors) and the linear modules to leave in float (``ignore``); each weight
becomes int8 ``[out, in]`` plus a float32 ``weight_scale`` ``[out, 1]``, quantized as
compressed-tensors' min-max observer does (symmetric per output channel, zero kept
representable: ``scale = absmax / 127.5``, ``q = clamp(rne(w / scale), -128, 127)``),
and ``config.json`` gets the ``quantization_config`` llm-compressor writes for W8A8:
``format: int-quantized``, 8-bit symmetric per-channel weights, dynamic 8-bit symmetric
per-token input activations, targets ``Linear``. Activations are quantized at run time
by whoever serves the checkpoint (vLLM: ``absmax / 127``; docs/quantization.md).
Only torch and safetensors are needed.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec

WEIGHTS_FILE = "model.safetensors"
# The tiny Qwen3's linear layers: attention and MLP projections (lm_head stays float).
QWEN3_LINEAR_WEIGHTS = r"model\.layers\.\d+\.(self_attn|mlp)\.\w+_proj\.weight"
QWEN3_IGNORE = ("lm_head",)
# The tiny Qwen3.5's text linears (causal or composite names): full attention, Gated
# DeltaNet projections and MLP. The vision tower, the MTP head and lm_head stay float,
# the way the log's ``-W8A8-INT8-Dynamic`` composite keeps its vision tower.
QWEN3_5_LINEAR_WEIGHTS = (
    r"model\.(language_model\.)?layers\.\d+\.(self_attn|mlp|linear_attn)"
    r"\.\w+_proj(_\w+)?\.weight"
)
QWEN3_5_IGNORE = ("lm_head", "re:.*visual.*", "re:.*mtp.*")
# The trained tiny with an MTP head (``--mtp``): the head's fc and its decoder layer's
# linears are int8 too, as in released W8A8 Qwen3.5 checkpoints; its norms stay float.
QWEN3_5_MTP_LINEAR_WEIGHTS = r"mtp\.(fc|layers\.\d+\.(self_attn|mlp)\.\w+_proj)\.weight"
QWEN3_5_MTP_IGNORE = ("lm_head", "re:.*visual.*")
# Qwen3.5-MoE adds the shared expert and every routed expert's projections; the router
# (``mlp.gate``) and the shared-expert gate stay float, as released W8A8 checkpoints
# list them in ``ignore``.
QWEN3_5_MOE_LINEAR_WEIGHTS = (
    r"model\.(language_model\.)?layers\.\d+\."
    r"(self_attn|linear_attn|mlp\.shared_expert|mlp\.experts\.\d+)"
    r"\.\w+_proj(_\w+)?\.weight"
)
QWEN3_5_MOE_IGNORE = (*QWEN3_5_IGNORE, "re:.*mlp.gate$", "re:.*shared_expert_gate$")


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[out, in]`` float -> (int8 ``[out, in]``, float32 scale ``[out, 1]``)."""
    import torch

    wf = w.float()
    absmax = wf.abs().amax(dim=1, keepdim=True)
    scale = absmax / 127.5
    # compressed-tensors replaces a zero scale by float32's eps (an all-zero row)
    scale = torch.where(scale == 0, torch.finfo(torch.float32).eps, scale)
    q = torch.round(wf / scale).clamp(-128, 127).to(torch.int8)
    return q, scale


def quant_args(
    num_bits: int,
    strategy: str,
    symmetric: bool = True,
    group_size: int | None = None,
    dynamic: bool = False,
    observer: str | None = "minmax",
) -> dict:
    """compressed-tensors' ``QuantizationArgs`` for integers, as llm-compressor writes
    them into a config group (the W8A8 and W4A16 writers share it)."""
    return {
        "num_bits": num_bits,
        "type": "int",
        "symmetric": symmetric,
        "strategy": strategy,
        "dynamic": dynamic,
        "group_size": group_size,
        "block_structure": None,
        "actorder": None,
        "observer": observer,
        "observer_kwargs": {},
    }


def w8a8_dynamic_config(ignore: Sequence[str]) -> dict:
    """The ``quantization_config`` of a W8A8-INT8 dynamic compressed-tensors checkpoint."""

    def args(strategy: str, dynamic: bool, observer: str | None) -> dict:
        return quant_args(8, strategy, dynamic=dynamic, observer=observer)

    return {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": args("channel", False, "minmax"),
                "input_activations": args("token", True, None),
                "output_activations": None,
            }
        },
        "ignore": list(ignore),
        "kv_cache_scheme": None,
        "sparsity_config": {},
    }


def select(names: Iterable[str], pattern: str) -> list[str]:
    """The tensor names that match ``pattern`` in full, sorted."""
    rx = re.compile(pattern)
    return sorted(n for n in names if rx.fullmatch(n))


def quantize_tensors(
    tensors: dict[str, torch.Tensor], weights: Sequence[str]
) -> dict[str, torch.Tensor]:
    """A copy of ``tensors`` with each name in ``weights`` quantized (plus its scale)."""
    missing = [w for w in weights if w not in tensors]
    bad = [w for w in weights if w in tensors and tensors[w].dim() != 2]
    if missing or bad or not weights:
        raise ValueError(
            "quantize: "
            + (f"not in the checkpoint: {missing}; " if missing else "")
            + (f"not 2-D [out, in] linear weights: {bad}; " if bad else "")
            + ("no weights named; " if not weights else "")
            + "name the linear weights of the model (e.g. with select())"
        )
    out = dict(tensors)
    for name in weights:
        if not name.endswith(".weight"):
            raise ValueError(f"quantize: {name!r} is not a '<module>.weight' tensor")
        q, scale = quantize_weight(tensors[name])
        out[name] = q
        out[name.removesuffix(".weight") + ".weight_scale"] = scale
    return out


def quantize_checkpoint(
    directory: str | os.PathLike[str],
    weights: Sequence[str],
    ignore: Sequence[str],
) -> Path:
    """Quantize the checkpoint in ``directory`` in place (one ``model.safetensors``).

    ``weights``: the linear weights to quantize; ``ignore``: the linear modules that
    stay float (vLLM treats every other ``Linear`` as quantized, so the two must cover
    the model's linear layers).
    """
    from safetensors.torch import load_file, save

    from vllm_kunlun.demo.tiny_model import write_atomic

    out = Path(directory)
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    if "quantization_config" in config:
        raise ValueError(f"{out} is already quantized ({config_path})")
    tensors = quantize_tensors(load_file(str(out / WEIGHTS_FILE)), weights)
    config["quantization_config"] = w8a8_dynamic_config(ignore)
    write_atomic(out / WEIGHTS_FILE, save(tensors, metadata={"format": "pt"}))
    write_atomic(
        config_path, (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
    )
    return out


def w8a8_marker(spec: TinyQwen3_5Spec | None = None) -> dict:
    """The marker of a complete W8A8 tiny checkpoint of ``spec`` (None: the Qwen3)."""
    from vllm_kunlun.demo.tiny_model import TinyQwen3Spec

    return {**(spec or TinyQwen3Spec()).marker(), "quant": "w8a8"}


def w8a8_cache_dir(spec: TinyQwen3_5Spec | None = None) -> Path:
    """The float model's cache directory with ``-w8a8`` appended."""
    from vllm_kunlun.demo.tiny_model import default_cache_dir

    float_dir = default_cache_dir(spec)
    return float_dir.with_name(float_dir.name + "-w8a8")


def ensure_tiny_w8a8(
    directory: str | os.PathLike[str],
    spec: TinyQwen3_5Spec | None = None,
    float_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Build the W8A8 checkpoint into ``directory`` unless a complete one is there;
    from a complete float checkpoint of ``spec`` in ``float_dir`` when given (the
    trained MTP model is not trained twice)."""
    from vllm_kunlun.demo.tiny_model import ensure_complete

    return ensure_complete(
        directory,
        w8a8_marker(spec),
        lambda d: write_tiny_w8a8(d, spec, float_dir),
    )


def write_tiny_w8a8(
    directory: str | os.PathLike[str],
    spec: TinyQwen3_5Spec | None = None,
    float_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """The tiny Qwen3 (``spec`` None) or the tiny Qwen3.5 of ``spec``, quantized to
    W8A8-INT8 dynamic; what stays float is ``QWEN3_IGNORE`` / ``QWEN3_5_IGNORE`` (with
    a trained MTP head, ``QWEN3_5_MTP_IGNORE``: the head is int8 too)."""
    from safetensors import safe_open

    from vllm_kunlun.demo.tiny_model import (
        MARKER,
        is_tiny_model,
        prepare_output_dir,
        write_atomic,
        write_tiny_model,
    )

    if float_dir is not None and is_tiny_model(float_dir, spec):
        import shutil

        out = prepare_output_dir(directory)
        for name in os.listdir(float_dir):
            shutil.copy2(Path(float_dir) / name, out / name)
    else:
        out = write_tiny_model(directory, spec)
    (out / MARKER).unlink()  # complete again only once quantized
    with safe_open(str(out / WEIGHTS_FILE), "pt") as f:
        names = list(f.keys())
    if spec is None:
        quantize_checkpoint(out, select(names, QWEN3_LINEAR_WEIGHTS), QWEN3_IGNORE)
    elif getattr(spec, "num_experts", 0):
        weights = select(names, QWEN3_5_MOE_LINEAR_WEIGHTS)
        quantize_checkpoint(out, weights, QWEN3_5_MOE_IGNORE)
    elif getattr(spec, "mtp_num_hidden_layers", 0):
        weights = select(names, QWEN3_5_LINEAR_WEIGHTS)
        weights += select(names, QWEN3_5_MTP_LINEAR_WEIGHTS)
        quantize_checkpoint(out, weights, QWEN3_5_MTP_IGNORE)
    else:
        weights = select(names, QWEN3_5_LINEAR_WEIGHTS)
        quantize_checkpoint(out, weights, QWEN3_5_IGNORE)
    marker = json.dumps(w8a8_marker(spec), indent=2, sort_keys=True) + "\n"
    write_atomic(out / MARKER, marker.encode())
    return out
