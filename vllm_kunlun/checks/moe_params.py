"""Qwen3.5-MoE parameters and weight memory from config.json alone, per card at a TP size.

Why: the budget check reads the weight files' size, but a planning directory (a copied
config.json, a checkpoint still downloading) has none, and ``checks/weights.py`` models
dense layers only. A 397B-A17B model is 99 % routed experts; without them the estimate
is off by two orders of magnitude.

How: every tensor transformers 5.2.0 builds for ``Qwen3_5MoeForConditionalGeneration``
(``models/qwen3_5_moe/modeling_qwen3_5_moe.py``), counted from the config:

- embeddings ``V x H``, an ``lm_head`` ``V x H`` unless tied, the final norm;
- per full-attention layer: ``q_proj`` ``2 x heads x head_dim`` (the output gate doubles
  it), ``k_proj`` / ``v_proj`` ``kv_heads x head_dim``, ``o_proj``, q / k norms;
- per Gated DeltaNet layer: ``in_proj_qkv`` ``2 x key + value``, ``in_proj_z``,
  ``in_proj_b`` / ``in_proj_a`` (one row per value head), ``out_proj``, the depthwise
  ``conv1d``, ``dt_bias``, ``A_log`` and the gated norm;
- per layer: the router ``mlp.gate`` ``E x H``, the routed experts ``E x 3 x H x I_moe``
  (gate, up, down), the shared expert ``3 x H x I_shared`` and its gate ``1 x H``, the
  two layer norms;
- the vision tower (Qwen3-VL style: patch embedding, position embedding, ``depth``
  blocks, the merger) when ``vision_config`` is there, counted in the total but not in
  the per-card weights: the plugin does not load it (``models/qwen3_5.py`` skips
  ``model.visual.*``). The MTP head (``mtp.*``) is not counted at all, for the same
  reason.

Bytes: the model dtype (2 for bfloat16). A compressed-tensors config with 8-bit
integer weights (``weights.int8_ignore``) makes every ``nn.Linear`` whose module name
its ``ignore`` list does not match int8 with one float32 scale per output channel;
embeddings, norms, the conv and the gate vectors are never linears, so never int8.
Real W8A8 checkpoints ignore ``lm_head``, the routers (``mlp.gate``), the
shared-expert gates and the vision tower; the estimate follows whatever the list says.

Per card (vLLM's layers, as ``models/qwen3_5_moe.py`` builds them): embeddings, lm_head,
q / o projections, the GDN projections, conv and gate vectors, the shared expert and the
routed experts are split over the TP ranks (the experts by their intermediate width;
with ``--enable-expert-parallel`` by whole experts, the same bytes per card); K / V
projections are split by head and replicated once TP exceeds the KV heads (2 KV heads
at TP 8: each card holds one head); the routers, the shared-expert gates and the norms
are replicated on every card.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_kunlun.checks.config_file import ConfigRangeError, config_dtype, config_int
from vllm_kunlun.checks.param_tensor import Tensor
from vllm_kunlun.checks.weights import int8_ignore, matches_module

MOE_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")
"""``model_type`` of the composite config and of its ``text_config``."""
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
INT8_SCALE_BYTES = 4
"""One float32 scale per output channel of an int8 linear (compressed-tensors' channel
strategy)."""


@dataclass(frozen=True)
class MoeWeights:
    """What ``estimate_moe_weights`` found: tensors, which are int8, and the source."""

    tensors: tuple[Tensor, ...]
    int8: frozenset[int]  # indices into ``tensors`` stored as int8 (+ scales)
    dtype_bytes: int
    vision_params: int
    source: str
    quantized: bool = False
    by_group: dict[str, int] = field(default_factory=dict)

    @property
    def text_params(self) -> int:
        return sum(t.params for t in self.tensors)

    @property
    def total_params(self) -> int:
        """Text model + vision tower: the number model cards publish (no MTP head)."""
        return self.text_params + self.vision_params

    def per_card(self, tp: int) -> int:
        """Bytes one card holds at TP ``tp`` (the text model; vision and MTP are not
        loaded)."""
        total = 0.0
        for i, t in enumerate(self.tensors):
            rows = t.rows_per_card(tp) * t.count
            if i in self.int8:
                total += rows * (t.cols + INT8_SCALE_BYTES)
            else:
                total += rows * t.cols * self.dtype_bytes
        return int(total)

    def total_bytes(self) -> int:
        """The text model's bytes on one card at TP 1."""
        return self.per_card(1)


def is_moe_config(config: Mapping[str, Any]) -> bool:
    text = config.get("text_config")
    text = text if isinstance(text, Mapping) else config
    return str(text.get("model_type") or config.get("model_type") or "") in MOE_TYPES


def _layer_types(text: Mapping[str, Any], n: int) -> list[str]:
    types = text.get("layer_types")
    if types is None:
        interval = config_int(text, "full_attention_interval", "", 4)
        return [
            "linear_attention" if (i + 1) % interval else "full_attention"
            for i in range(n)
        ]
    if not isinstance(types, list) or len(types) != n:
        raise ConfigRangeError(
            f"config.json: layer_types must list num_hidden_layers = {n} entries"
        )
    return [str(t) for t in types]


def vision_params(vision: Mapping[str, Any], text_hidden: int) -> int:
    """The Qwen3-VL-style vision tower of transformers 5.2.0's Qwen3_5MoeVisionModel
    (biases and LayerNorms included); defaults are the config class's."""

    def get(key: str, default: int) -> int:
        return config_int(vision, key, "vision_config", default)

    h = get("hidden_size", 1152)
    inter = get("intermediate_size", 4304)
    depth = get("depth", 27)
    patch, temporal = get("patch_size", 16), get("temporal_patch_size", 2)
    channels, merge = get("in_channels", 3), get("spatial_merge_size", 2)
    out = get("out_hidden_size", text_hidden)
    positions = get("num_position_embeddings", 2304)
    patch_embed = channels * temporal * patch * patch * h + h
    block = (
        2 * 2 * h  # norm1, norm2 (LayerNorm: weight and bias)
        + h * 3 * h
        + 3 * h  # attn.qkv
        + h * h
        + h  # attn.proj
        + h * inter
        + inter  # mlp.linear_fc1
        + inter * h
        + h  # mlp.linear_fc2
    )
    merged = h * merge * merge
    merger = 2 * h + merged * merged + merged + merged * out + out
    return patch_embed + positions * h + depth * block + merger


def moe_tensors(config: Mapping[str, Any]) -> list[Tensor]:
    """Every text-model tensor of a Qwen3.5-MoE config; ConfigRangeError names a field
    that is missing or out of range."""
    sub = config.get("text_config")
    nested = isinstance(sub, Mapping)
    text: Mapping[str, Any] = sub if isinstance(sub, Mapping) else config
    where = "text_config" if nested else ""

    def get(key: str, default: Any = None) -> int:
        return config_int(text, key, where, default)

    h, vocab, n = get("hidden_size"), get("vocab_size"), get("num_hidden_layers")
    heads = get("num_attention_heads")
    kv = get("num_key_value_heads", heads)
    hd = get("head_dim") if text.get("head_dim") is not None else h // heads
    experts, inter = get("num_experts"), get("moe_intermediate_size")
    shared = config_int(text, "shared_expert_intermediate_size", where, 0, minimum=0)
    prefix = "model.language_model." if nested else "model."
    tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings")))

    out = [Tensor("embeddings", f"{prefix}embed_tokens", vocab, h, linear=False)]
    if not tied:
        out.append(Tensor("lm_head", "lm_head", vocab, h))
    out.append(Tensor("norms", f"{prefix}norm", h, 1, linear=False, split="replicated"))
    types = _layer_types(text, n)
    gdn = "linear_attention" in types
    if gdn:
        k_heads, v_heads = get("linear_num_key_heads"), get("linear_num_value_heads")
        key = k_heads * get("linear_key_head_dim")
        dv = get("linear_value_head_dim")
        value = v_heads * dv
        conv = get("linear_conv_kernel_dim")
    for i, kind in enumerate(types):
        p = f"{prefix}layers.{i}."
        if kind == "linear_attention":
            a = p + "linear_attn."
            out += [
                Tensor("gdn", a + "in_proj_qkv", 2 * key + value, h),
                Tensor("gdn", a + "in_proj_z", value, h),
                Tensor("gdn", a + "in_proj_b", v_heads, h),
                Tensor("gdn", a + "in_proj_a", v_heads, h),
                Tensor("gdn", a + "out_proj", h, value),
                Tensor("gdn", a + "conv1d", 2 * key + value, conv, linear=False),
                Tensor("gdn", a + "dt_bias", v_heads, 1, linear=False),
                Tensor("gdn", a + "A_log", v_heads, 1, linear=False),
                Tensor("norms", a + "norm", dv, 1, linear=False, split="replicated"),
            ]
        else:
            a = p + "self_attn."
            out += [
                Tensor("attention", a + "q_proj", 2 * heads * hd, h),
                Tensor("attention", a + "k_proj", kv * hd, h, split="kv", kv_heads=kv),
                Tensor("attention", a + "v_proj", kv * hd, h, split="kv", kv_heads=kv),
                Tensor("attention", a + "o_proj", h, heads * hd),
                Tensor("norms", a + "q_norm", hd, 1, linear=False, split="replicated"),
                Tensor("norms", a + "k_norm", hd, 1, linear=False, split="replicated"),
            ]
        m = p + "mlp."
        out += [
            Tensor("router", m + "gate", experts, h, split="replicated"),
            Tensor("experts", m + "experts.0.gate_proj", inter, h, count=experts),
            Tensor("experts", m + "experts.0.up_proj", inter, h, count=experts),
            Tensor("experts", m + "experts.0.down_proj", h, inter, count=experts),
        ]
        if shared:
            out += [
                Tensor("shared_expert", m + "shared_expert.gate_proj", shared, h),
                Tensor("shared_expert", m + "shared_expert.up_proj", shared, h),
                Tensor("shared_expert", m + "shared_expert.down_proj", h, shared),
                Tensor("router", m + "shared_expert_gate", 1, h, split="replicated"),
            ]
        out += [
            Tensor(
                "norms", p + "input_layernorm", h, 1, linear=False, split="replicated"
            ),
            Tensor(
                "norms",
                p + "post_attention_layernorm",
                h,
                1,
                linear=False,
                split="replicated",
            ),
        ]
    return out


def _ignored(name: str, ignore: list[str]) -> bool:
    """compressed-tensors' matching, tried on the checkpoint's name and on the same
    name without the composite model's ``language_model.`` (vLLM's text-only module
    names)."""
    names = {name, name.replace("model.language_model.", "model.", 1)}
    return any(matches_module(n, ignore) for n in names)


def estimate_moe_weights(config: Mapping[str, Any]) -> MoeWeights | None:
    """The weights of a Qwen3.5-MoE config (or of a Qwen3-MoE, Qwen3-Next, GLM-4.5
    one: ``checks/moe_families.py``), or None for another family. A missing or
    out-of-range dimension raises ConfigRangeError naming it."""
    from vllm_kunlun.checks.moe_families import family_tensors

    tensors = moe_tensors(config) if is_moe_config(config) else family_tensors(config)
    if tensors is None:
        return None
    sub = config.get("text_config")
    text: Mapping[str, Any] = sub if isinstance(sub, Mapping) else config
    dtype = config_dtype(config)
    ignore = int8_ignore(config)
    int8 = frozenset(
        i
        for i, t in enumerate(tensors)
        if ignore is not None and t.linear and not _ignored(t.name, ignore)
    )
    vision = config.get("vision_config")
    vis = (
        vision_params(vision, config_int(text, "hidden_size", ""))
        if isinstance(vision, Mapping)
        else 0
    )
    by_group: dict[str, int] = {}
    for t in tensors:
        by_group[t.group] = by_group.get(t.group, 0) + t.params
    q = config.get("quantization_config") or text.get("quantization_config")
    if ignore is not None:
        kind = (
            "W8A8: int8 linears + float32 channel scales, "
            f"what the ignore list names {dtype}"
        )
    elif isinstance(q, Mapping):
        kind = (
            f"{dtype} weights: quantization_config {q.get('quant_method')!r} is not "
            "modelled, so this is an upper bound"
        )
    else:
        kind = f"{dtype} weights"
    vision_note = (
        f"; vision tower ({vis / 1e9:.2f}B params) not loaded, not counted"
        if vis
        else ""
    )
    return MoeWeights(
        tensors=tuple(tensors),
        int8=int8,
        dtype_bytes=DTYPE_BYTES.get(dtype, 2),
        vision_params=vis,
        source=(
            f"estimated from config.json (MoE, {kind}; "
            f"{(sum(by_group.values())) / 1e9:.2f}B text params{vision_note}; "
            "no weight files)"
        ),
        quantized=ignore is not None,
        by_group=by_group,
    )
