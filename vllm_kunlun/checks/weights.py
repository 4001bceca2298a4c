"""Weight memory from a model's config.json: the linear layers, and what W8A8 saves.

Why: the budget check reads the weight files' size, but a planning directory (a copied
config.json, a checkpoint still downloading) has none, and for a W8A8-INT8 checkpoint
the answer is half the bf16 one. The benchmark needs the same per-layer shapes to
state what int8 saves on the log's 27B model.
How: the linear layers of the model family, as transformers 5.2.0's modeling code
builds them (Qwen3: q/k/v/o + gate/up/down; Qwen3.5: full attention with an output gate
(q_proj is 2 x heads x head_dim), Gated DeltaNet in_proj_qkv / in_proj_z / in_proj_b /
in_proj_a / out_proj, a dense MLP in every layer), plus the embeddings and an untied
lm_head. A compressed-tensors config with 8-bit integer weights makes every linear layer
not in its ``ignore`` list int8 with one float32 scale per output channel. A weight-only
4-bit / 8-bit config (AWQ, GPTQ, compressed-tensors W4A16 ``pack-quantized``) makes them
``bits / 8`` bytes a weight, one model-dtype scale per group and output channel, packed
zero points where the format stores them and GPTQ's int32 ``g_idx`` (``weight_only``,
``weight_only_linear_bytes``). Norms, GDN
conv / gate vectors and biases (< 0.1% of a 27B model) are left out. MoE, vision towers
and MTP heads are not counted: an estimate says so in its source.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_kunlun.checks.config_file import config_int

# The log's model family, Qwen3.5-27B (the checkpoint served was its W8A8-INT8-Dynamic
# quantization). Sources: issue 9 of this project (64 layers, 48 Gated DeltaNet; GDN 16
# key / 48 value heads of 128, conv kernel 4; 4 KV heads of 256); the public model
# cards of Qwen3.5-27B derivatives and of Qwen3.6-27B, which shares the qwen3_5
# architecture (hidden 5120, intermediate 17,408, 24 query heads, vocabulary 248,320,
# layer pattern 3 x GDN + 1 x full attention); projection shapes from transformers
# 5.2.0's modeling_qwen3_5.py. The full checkpoint also has a vision tower and an MTP
# layer, which are not counted here.
QWEN3_5_27B: dict[str, Any] = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_5_text",
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": 64,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 16,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "vocab_size": 248320,
        "dtype": "bfloat16",
    },
}

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
_DENSE_TYPES = ("qwen3", "qwen2", "llama", "mistral")
_HYBRID_TYPES = ("qwen3_5", "qwen3_5_text")


@dataclass(frozen=True)
class Linear:
    """One linear layer of a decoder layer (or the lm_head): ``out`` x ``inp``."""

    name: str  # module path relative to the decoder layer, e.g. "self_attn.q_proj"
    out: int
    inp: int
    layers: int  # how many decoder layers have it

    @property
    def params(self) -> int:
        return self.out * self.inp * self.layers


def _text(config: Mapping[str, Any]) -> Mapping[str, Any]:
    text = config.get("text_config") or config
    if not isinstance(text, Mapping):
        raise TypeError("text_config is not an object")
    return text


def _int(text: Mapping[str, Any], key: str, default: Any = None) -> int:
    """A range-checked dimension (ConfigRangeError names it): 1e30 layers would
    otherwise build a 1e30-entry list."""
    return config_int(text, key, "", default)


def _layer_types(text: Mapping[str, Any]) -> list[str]:
    n = _int(text, "num_hidden_layers")
    types = text.get("layer_types")
    if types is None:
        interval = _int(text, "full_attention_interval", 4)
        types = [
            "linear_attention" if (i + 1) % interval else "full_attention"
            for i in range(n)
        ]
    return list(types)


def linear_layers(config: Mapping[str, Any]) -> list[Linear] | None:
    """The decoder's linear layers by kind; None for a family not modelled here."""
    text = _text(config)
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    h = _int(text, "hidden_size")
    heads = _int(text, "num_attention_heads")
    hd = _int(text, "head_dim") if text.get("head_dim") else h // heads
    kv = _int(text, "num_key_value_heads") if text.get("num_key_value_heads") else heads
    inter = _int(text, "intermediate_size")
    n = _int(text, "num_hidden_layers")
    if model_type in _DENSE_TYPES:
        attn, gated = n, False
    elif model_type in _HYBRID_TYPES:
        attn = sum(t == "full_attention" for t in _layer_types(text))
        gated = True  # Qwen3.5's attention output gate doubles q_proj
    else:
        return None
    layers = [
        Linear("self_attn.q_proj", heads * hd * (2 if gated else 1), h, attn),
        Linear("self_attn.k_proj", kv * hd, h, attn),
        Linear("self_attn.v_proj", kv * hd, h, attn),
        Linear("self_attn.o_proj", h, heads * hd, attn),
    ]
    gdn = n - attn
    if gdn:
        key = _int(text, "linear_num_key_heads") * _int(text, "linear_key_head_dim")
        v_heads = _int(text, "linear_num_value_heads")
        value = v_heads * _int(text, "linear_value_head_dim")
        layers += [
            Linear("linear_attn.in_proj_qkv", 2 * key + value, h, gdn),
            Linear("linear_attn.in_proj_z", value, h, gdn),
            Linear("linear_attn.in_proj_b", v_heads, h, gdn),
            Linear("linear_attn.in_proj_a", v_heads, h, gdn),
            Linear("linear_attn.out_proj", h, value, gdn),
        ]
    layers += [
        Linear("mlp.gate_proj", inter, h, n),
        Linear("mlp.up_proj", inter, h, n),
        Linear("mlp.down_proj", h, inter, n),
    ]
    return layers


def int8_ignore(config: Mapping[str, Any]) -> list[str] | None:
    """The ``ignore`` list of a compressed-tensors config whose weights are 8-bit
    integers (W8A8 / W8A16), or None when the weights are not int8."""
    q = config.get("quantization_config") or _text(config).get("quantization_config")
    if not isinstance(q, Mapping) or q.get("quant_method") != "compressed-tensors":
        return None
    groups = list((q.get("config_groups") or {}).values())
    if not groups or not all(
        (g.get("weights") or {}).get("num_bits") == 8
        and (g.get("weights") or {}).get("type", "int") == "int"
        for g in groups
    ):
        return None
    return [str(i) for i in q.get("ignore") or []]


@dataclass(frozen=True)
class WeightOnly:
    """A weight-only integer checkpoint's layout, as its bytes count."""

    label: str
    bits: int
    group_size: int  # -1: one group (per output channel)
    zero_points: bool
    g_idx: bool  # GPTQ stores an int32 group index per input row
    ignore: tuple[str, ...]  # compressed-tensors' ignore list
    not_converted: tuple[str, ...]  # AWQ's modules_to_not_convert (substrings)
    targets: tuple[str, ...] = ()  # compressed-tensors' targets (() : every linear)

    def covers(self, name: str) -> bool:
        """Whether the linear module ``name`` is quantized by this scheme."""
        if matches_module(name, list(self.ignore)) or any(
            m in name for m in self.not_converted
        ):
            return False
        return (
            not self.targets
            or "Linear" in self.targets
            or matches_module(name, list(self.targets))
        )


def weight_only(config: Mapping[str, Any]) -> list[WeightOnly]:
    """The weight-only schemes of an AWQ, GPTQ or compressed-tensors W4A16 / W8A16
    (``pack-quantized``, no activation quantization: one per config group) config;
    [] for any other config."""
    q = config.get("quantization_config") or _text(config).get("quantization_config")
    if not isinstance(q, Mapping):
        return []
    method = q.get("quant_method")
    if method == "awq":
        return [
            WeightOnly(
                "AWQ",
                int(q.get("bits", q.get("w_bit", 4))),
                int(q.get("group_size", q.get("q_group_size", 128))),
                bool(q.get("zero_point", True)),
                False,
                (),
                tuple(q.get("modules_to_not_convert") or ()),
            )
        ]
    if method == "gptq":
        return [
            WeightOnly(
                "GPTQ", int(q["bits"]), int(q.get("group_size", -1)), True, True, (), ()
            )
        ]
    if method != "compressed-tensors" or q.get("format") != "pack-quantized":
        return []
    groups = list((q.get("config_groups") or {}).values())
    if not groups or any(g.get("input_activations") for g in groups):
        return []
    ignore = tuple(str(i) for i in q.get("ignore") or [])
    schemes = []
    for g in groups:
        w = g.get("weights") or {}
        schemes.append(
            WeightOnly(
                "compressed-tensors pack-quantized",
                int(w.get("num_bits", 4)),
                int(w.get("group_size") or -1),
                not w.get("symmetric", True),
                False,
                ignore,
                (),
                tuple(str(t) for t in g.get("targets") or ()),
            )
        )
    return schemes


def weight_only_linear_bytes(
    linear: Linear, scheme: WeightOnly, scale_bytes: int
) -> int:
    """Packed weight, scales, zero points (and ``g_idx``) of one linear, all layers."""
    groups = -(-linear.inp // scheme.group_size) if scheme.group_size > 0 else 1
    per_layer = linear.out * linear.inp * scheme.bits // 8
    per_layer += linear.out * groups * scale_bytes
    if scheme.zero_points:
        per_layer += linear.out * groups * scheme.bits // 8
    if scheme.g_idx:
        per_layer += 4 * linear.inp
    return per_layer * linear.layers


def matches_module(name: str, patterns: list[str]) -> bool:
    """compressed-tensors' matching (its ``ignore`` and ``targets`` lists):
    ``re:<regex>`` matched from the start, else the exact module name."""
    return any(
        re.match(entry[3:], name) if entry.startswith("re:") else entry == name
        for entry in patterns
    )


@dataclass(frozen=True)
class WeightEstimate:
    total_bytes: int
    int8_linear_params: int
    source: str

    def per_card(self, tp: int) -> int:
        return self.total_bytes // tp


def int8_linear_bytes(linear: Linear) -> int:
    """int8 weight plus one float32 scale per output channel, all layers."""
    return (linear.out * linear.inp + 4 * linear.out) * linear.layers


def estimate_weights(config: Mapping[str, Any]) -> WeightEstimate | None:
    """Weight bytes of the whole model from its config, or None (family not modelled,
    or the config lacks a dimension)."""
    try:
        layers = linear_layers(config)
        text = _text(config)
        h, vocab = _int(text, "hidden_size"), _int(text, "vocab_size")
    except (KeyError, TypeError, ValueError):
        return None
    if layers is None:
        return None
    dtype = str(
        text.get("dtype") or text.get("torch_dtype") or config.get("torch_dtype") or ""
    ).replace("torch.", "")
    dtype_bytes = DTYPE_BYTES.get(dtype, 2)
    tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings")))
    total = vocab * h * dtype_bytes * (1 if tied else 2)
    ignore = int8_ignore(config)
    schemes = weight_only(config) if ignore is None else []
    int8_params = 0
    for linear in layers:
        name = f"model.layers.0.{linear.name}"
        scheme = next((w for w in schemes if w.covers(name)), None)
        if scheme is not None:
            total += weight_only_linear_bytes(linear, scheme, dtype_bytes)
        elif ignore is not None and not matches_module(name, ignore):
            total += int8_linear_bytes(linear)
            int8_params += linear.params
        else:
            total += linear.params * dtype_bytes
    kind = (
        "W8A8: int8 linear weights + float32 channel scales"
        if ignore is not None
        else f"{dtype or 'bfloat16'} weights"
    )
    if schemes:
        first = schemes[0]
        group = "channel" if first.group_size <= 0 else f"group {first.group_size}"
        kind = (
            f"{first.label}: {first.bits}-bit linear weights + {dtype or 'bfloat16'} "
            f"{group} scales" + (" + zero points" if first.zero_points else "")
        )
        if len(schemes) > 1:
            kind = f"{first.label}: {len(schemes)} weight-only schemes"
    return WeightEstimate(
        total, int8_params, f"estimated from config.json ({kind}; no weight files)"
    )
