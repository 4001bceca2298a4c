"""A deterministic tiny Qwen3.5 hybrid checkpoint (Gated DeltaNet + full attention).

Why: the log's model is a Qwen3.5-family hybrid served as the vision-language composite.
The plugin's hybrid path (model, GDN kernels, hybrid KV cache, state fixes) needs a real
checkpoint that vLLM loads through its normal path and that transformers 5.2.0 can run
as the reference, without a download. Two layouts, as transformers writes them:

- ``causal``: ``Qwen3_5ForCausalLM`` (``model_type`` ``qwen3_5_text``), weights ``model.*``;
- ``composite``: ``Qwen3_5ForConditionalGeneration`` (``model_type`` ``qwen3_5``) with the
  text config nested in ``text_config``, weights ``model.language_model.*``, a working
  one-block vision tower under ``model.visual.*`` and one ``mtp.*`` weight (skipped),
  as real checkpoints carry them; the vision tokens (``<|vision_start|>``,
  ``<|vision_end|>``, ``<|image_pad|>``, ``<|video_pad|>``) at the end of the vocabulary,
  a chat template that places them, and the processor files transformers' and vLLM's
  ``Qwen3VLProcessor`` read (``preprocessor_config.json``,
  ``video_preprocessor_config.json``) with small min/max pixels (a handful of tokens per
  image).

The text weights are the same in both layouts, so both must generate the same tokens:
the composite's four extra vocabulary rows are appended after the shared draws, with
zero ``lm_head`` rows (logit 0, far below the greedy winner: never generated).
Scales follow ``tiny_model``: untied embeddings and a wide ``lm_head`` for clear greedy
margins; slow GDN decay (A in [0.05, 0.5]) so the recurrent and conv states carry
information across tokens, chunks and steps (a state bug changes the output).

Only torch, safetensors and tokenizers are needed (no vLLM, no transformers).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from vllm_kunlun.demo.tiny_model import CHAT_TEMPLATE, SEED, decoder_fields

FORMAT_VERSION = 2  # 2: the composite sees (vision tokens, processor files)
LAYOUTS = ("causal", "composite")
ARCHITECTURES = {
    "causal": "Qwen3_5ForCausalLM",
    "composite": "Qwen3_5ForConditionalGeneration",
}


# Appended to the composite's vocabulary in this order (ids vocab-4 .. vocab-1).
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")

# tiny_model.CHAT_TEMPLATE for string content (the same rendering, so text chats keep
# their tokens); list content (images, videos, text parts) places each part's
# placeholder where Qwen's own template does.
VL_CHAT_TEMPLATE = (
    "{%- set names = {'system': 'the model', 'user': 'you', 'assistant': 'i'} -%}"
    "{%- for message in messages -%}"
    "{{ names.get(message['role'], message['role']) }} :"
    "{%- if message['content'] is string %} {{ message['content'] }}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or part['type'] == 'image_url' -%}"
    " <|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part['type'] == 'video' or part['type'] == 'video_url' -%}"
    " <|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif part['type'] == 'text' %} {{ part['text'] }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}i :{%- endif -%}"
)


@dataclass(frozen=True)
class TinyQwen3_5Spec:
    """Shape of the tiny hybrid: three GDN layers, then one full-attention layer."""

    layout: str = "causal"
    num_hidden_layers: int = 4
    full_attention_interval: int = 4
    hidden_size: int = 64
    intermediate_size: int = 128
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, int, int] = (2, 1, 1)  # sums to rotary_dim / 2
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4  # two value heads per key head, as in the 27B
    linear_key_head_dim: int = 16
    linear_value_head_dim: int = 16
    linear_conv_kernel_dim: int = 4
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    vision_hidden_size: int = 32
    vision_patch_size: int = 4

    # The processor's pixel bounds: 4..64 merged tokens per image.
    min_pixels: int = 16 * 16
    max_pixels: int = 64 * 64

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(
                f"layout {self.layout!r} is not one of {', '.join(LAYOUTS)}"
            )

    # model_type of the composite; the text config's is this plus "_text".
    model_type = "qwen3_5"

    @property
    def architecture(self) -> str:
        return ARCHITECTURES[self.layout]

    def text_fields(self) -> dict:
        """Config fields of this kind only (the MoE spec adds its experts)."""
        return {}

    def mlp_weights(self, prefix: str, linear: Any) -> dict:
        """One layer's MLP tensors under ``prefix`` (``<layer>.mlp.``); ``linear(out,
        in)`` draws a weight from the checkpoint's one random stream."""
        h, inter = self.hidden_size, self.intermediate_size
        return {
            prefix + "gate_proj.weight": linear(inter, h),
            prefix + "up_proj.weight": linear(inter, h),
            prefix + "down_proj.weight": linear(h, inter),
        }

    @property
    def layer_types(self) -> list[str]:
        interval = self.full_attention_interval
        return [
            "linear_attention" if (i + 1) % interval else "full_attention"
            for i in range(self.num_hidden_layers)
        ]

    # ---- tiny_model.TinySpec --------------------------------------------------------
    @property
    def cache_name(self) -> str:
        return f"tiny-{self.model_type}-{self.layout}"

    def marker(self) -> dict:
        # Through JSON, so that it compares equal to the marker file read back.
        marker = {"seed": SEED, "format": FORMAT_VERSION, **asdict(self)}
        return dict(json.loads(json.dumps(marker)))

    def config(self, vocab_size: int) -> dict:
        return config(self, vocab_size)

    # ---- what the composite adds to the tiny_model writer ------------------------
    @property
    def added_tokens(self) -> tuple[str, ...]:
        return VISION_TOKENS if self.layout == "composite" else ()

    @property
    def chat_template(self) -> str:
        return VL_CHAT_TEMPLATE if self.layout == "composite" else CHAT_TEMPLATE

    def extra_files(self) -> dict[str, dict]:
        return processor_files(self) if self.layout == "composite" else {}

    def weights(self, vocab_size: int) -> dict:
        return weights(self, vocab_size)


def _text_config(spec: TinyQwen3_5Spec, vocab_size: int) -> dict:
    return {
        "model_type": spec.model_type + "_text",
        **decoder_fields(spec, vocab_size),
        **spec.text_fields(),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": spec.rope_theta,
            "partial_rotary_factor": spec.partial_rotary_factor,
            "mrope_section": list(spec.mrope_section),
            "mrope_interleaved": True,
        },
        "partial_rotary_factor": spec.partial_rotary_factor,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "layer_types": spec.layer_types,
        "full_attention_interval": spec.full_attention_interval,
        "linear_conv_kernel_dim": spec.linear_conv_kernel_dim,
        "linear_key_head_dim": spec.linear_key_head_dim,
        "linear_value_head_dim": spec.linear_value_head_dim,
        "linear_num_key_heads": spec.linear_num_key_heads,
        "linear_num_value_heads": spec.linear_num_value_heads,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 2,
        "dtype": "float32",
        "use_cache": True,
    }


def _vision_config(spec: TinyQwen3_5Spec) -> dict:
    return {
        "model_type": spec.model_type,
        "depth": 1,
        "hidden_size": spec.vision_hidden_size,
        "intermediate_size": 2 * spec.vision_hidden_size,
        "num_heads": 2,
        "in_channels": 3,
        "patch_size": spec.vision_patch_size,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": spec.hidden_size,
        "num_position_embeddings": 64,
    }


def config(spec: TinyQwen3_5Spec, vocab_size: int) -> dict:
    marker = spec.marker()
    text = _text_config(spec, vocab_size)
    if spec.layout == "causal":
        return {
            "architectures": [spec.architecture],
            **text,
            "vllm_kunlun_tiny": marker,
        }
    return {
        "architectures": [spec.architecture],
        "model_type": spec.model_type,
        "text_config": text,
        "vision_config": _vision_config(spec),
        # The last four vocabulary entries (VISION_TOKENS' order).
        "vision_start_token_id": vocab_size - 4,
        "vision_end_token_id": vocab_size - 3,
        "image_token_id": vocab_size - 2,
        "video_token_id": vocab_size - 1,
        "tie_word_embeddings": False,
        "dtype": "float32",
        "vllm_kunlun_tiny": marker,
    }


def _text_weights(spec: TinyQwen3_5Spec, vocab_size: int, prefix: str) -> dict:
    import torch

    gen = torch.Generator().manual_seed(SEED)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    def uniform(n: int, low: float, high: float) -> torch.Tensor:
        return low + (high - low) * torch.rand(n, generator=gen, dtype=torch.float32)

    h = spec.hidden_size
    hd, nq, nkv = spec.head_dim, spec.num_attention_heads, spec.num_key_value_heads
    hk, hv = spec.linear_num_key_heads, spec.linear_num_value_heads
    dk, dv = spec.linear_key_head_dim, spec.linear_value_head_dim
    key_dim, value_dim = hk * dk, hv * dv
    conv_dim = 2 * key_dim + value_dim

    def linear(out: int, inp: int, gain: float = 1.0) -> torch.Tensor:
        return normal(out, inp, std=gain / math.sqrt(inp))

    # Vision tokens at the end get rows of their own stream, after the shared draws.
    added = len(spec.added_tokens)
    embed = normal(vocab_size - added, h, std=1.0)
    if added:
        extra = torch.Generator().manual_seed(SEED + 3)
        rows = torch.randn(added, h, generator=extra, dtype=torch.float32)
        embed = torch.cat([embed, rows])
    w: dict[str, torch.Tensor] = {f"{prefix}embed_tokens.weight": embed}
    for i, kind in enumerate(spec.layer_types):
        p = f"{prefix}layers.{i}."
        # Qwen3.5 RMSNorm scales by (1 + weight): weights near 0 keep the gain near 1.
        w[p + "input_layernorm.weight"] = normal(h, std=0.1)
        if kind == "linear_attention":
            a = p + "linear_attn."
            w[a + "in_proj_qkv.weight"] = linear(conv_dim, h)
            w[a + "in_proj_z.weight"] = linear(value_dim, h)
            w[a + "in_proj_b.weight"] = linear(hv, h)
            w[a + "in_proj_a.weight"] = linear(hv, h, gain=0.5)
            w[a + "conv1d.weight"] = normal(
                conv_dim, 1, spec.linear_conv_kernel_dim, std=0.6
            )
            w[a + "dt_bias"] = normal(hv, std=0.5)
            w[a + "A_log"] = torch.log(uniform(hv, 0.05, 0.5))
            w[a + "norm.weight"] = 1.0 + normal(dv, std=0.1)  # plain weight (no +1)
            w[a + "out_proj.weight"] = linear(h, value_dim)
        else:
            s = p + "self_attn."
            # q_proj holds each head's query and its output gate: 2 x head_dim rows.
            w[s + "q_proj.weight"] = linear(2 * nq * hd, h)
            w[s + "k_proj.weight"] = linear(nkv * hd, h)
            w[s + "v_proj.weight"] = linear(nkv * hd, h)
            w[s + "o_proj.weight"] = linear(h, nq * hd)
            # (1 + ~1) = a gain of ~2 sharpens attention, so positions matter.
            w[s + "q_norm.weight"] = 1.0 + normal(hd, std=0.1)
            w[s + "k_norm.weight"] = 1.0 + normal(hd, std=0.1)
        w[p + "post_attention_layernorm.weight"] = normal(h, std=0.1)
        w.update(spec.mlp_weights(p + "mlp.", linear))
    w[f"{prefix}norm.weight"] = normal(h, std=0.1)
    return w


def _vision_weights(spec: TinyQwen3_5Spec) -> dict:
    """A one-block vision tower in transformers' Qwen3.5 names. Scales keep each
    layer's output near unit size, so the merged image features are as large as the
    token embeddings they replace and an image changes what the model says."""
    import torch

    gen = torch.Generator().manual_seed(SEED + 1)
    vh, out = spec.vision_hidden_size, spec.hidden_size
    merged = vh * 4

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    def linear(n_out: int, n_in: int) -> torch.Tensor:
        return normal(n_out, n_in, std=1.0 / math.sqrt(n_in))

    v = "model.visual."
    b = v + "blocks.0."
    ps = spec.vision_patch_size
    patch_in = 3 * 2 * ps * ps
    w = {
        v + "patch_embed.proj.weight": normal(
            vh, 3, 2, ps, ps, std=3.0 / patch_in**0.5
        ),
        v + "patch_embed.proj.bias": normal(vh, std=0.1),
        v + "pos_embed.weight": normal(64, vh, std=0.5),
        b + "norm1.weight": 1.0 + normal(vh, std=0.1),
        b + "norm1.bias": normal(vh, std=0.1),
        b + "norm2.weight": 1.0 + normal(vh, std=0.1),
        b + "norm2.bias": normal(vh, std=0.1),
        b + "attn.qkv.weight": linear(3 * vh, vh) * 2.0,
        b + "attn.qkv.bias": normal(3 * vh, std=0.1),
        b + "attn.proj.weight": linear(vh, vh),
        b + "attn.proj.bias": normal(vh, std=0.1),
        b + "mlp.linear_fc1.weight": linear(2 * vh, vh),
        b + "mlp.linear_fc1.bias": normal(2 * vh, std=0.1),
        b + "mlp.linear_fc2.weight": linear(vh, 2 * vh),
        b + "mlp.linear_fc2.bias": normal(vh, std=0.1),
        v + "merger.norm.weight": 1.0 + normal(vh, std=0.1),
        v + "merger.norm.bias": normal(vh, std=0.1),
        v + "merger.linear_fc1.weight": linear(merged, merged),
        v + "merger.linear_fc1.bias": normal(merged, std=0.1),
        v + "merger.linear_fc2.weight": linear(out, merged) * 2.0,
        v + "merger.linear_fc2.bias": normal(out, std=0.1),
    }
    return w


def processor_files(spec: TinyQwen3_5Spec) -> dict[str, dict]:
    """The image and video processor configs, as Qwen3.5 checkpoints ship them, with
    the tiny tower's patch size and small pixel bounds (``size``'s shortest/longest
    edge are the min/max pixel counts)."""
    common = {
        "patch_size": spec.vision_patch_size,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "do_resize": True,
        "processor_class": "Qwen3VLProcessor",
    }
    image = {
        **common,
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "size": {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels},
    }
    video = {
        **common,
        "video_processor_type": "Qwen3VLVideoProcessor",
        # Video bounds count frames too (two frames per temporal patch).
        "size": {
            "shortest_edge": 2 * spec.min_pixels,
            "longest_edge": 2 * spec.max_pixels,
        },
        "fps": 2,
        "min_frames": 2,
        "max_frames": 8,
        "do_sample_frames": False,
    }
    return {
        "preprocessor_config.json": image,
        "video_preprocessor_config.json": video,
    }


def weights(spec: TinyQwen3_5Spec, vocab_size: int) -> dict:
    import torch

    prefix = "model." if spec.layout == "causal" else "model.language_model."
    w = _text_weights(spec, vocab_size, prefix)
    gen = torch.Generator().manual_seed(SEED + 2)
    # A wide lm_head spreads the logits (std ~3): clear greedy margins, varied output.
    added = len(spec.added_tokens)
    w["lm_head.weight"] = torch.cat(
        [
            torch.randn(vocab_size - added, spec.hidden_size, generator=gen)
            * 3.0
            / math.sqrt(spec.hidden_size),
            torch.zeros(added, spec.hidden_size),  # vision tokens: never generated
        ]
    )
    if spec.layout == "composite":
        w.update(_vision_weights(spec))
        # Multi-token-prediction weights ship with real checkpoints; vLLM skips them.
        w["mtp.fc.weight"] = torch.randn(
            spec.hidden_size, 2 * spec.hidden_size, generator=gen
        )
    return w
