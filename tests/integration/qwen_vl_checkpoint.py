"""Tiny Qwen2.5-VL and Qwen3-VL checkpoints written by transformers 5.2.0's own classes.

``Qwen2_5_VLForConditionalGeneration`` / ``Qwen3VLForConditionalGeneration`` built from
their config classes with a seeded init and saved by ``save_pretrained``: the config as
5.2.0 writes it (the text fields nested in ``text_config``, ``tie_word_embeddings`` on
the top level only, which vLLM 0.15.1 reads from the text config: issue 42), the weights
as 5.2.0 names them. The offline tokenizer every tiny checkpoint shares
(``vllm_kunlun.demo.tiny_model``) with the four vision tokens at the end of the
vocabulary and the VL chat template of the tiny Qwen3.5 composite, and the processor
files both processors read (``Qwen2_5_VLProcessor`` / ``Qwen3VLProcessor``) with small
pixel bounds: a handful of tokens per image.

Vision towers are tiny (two blocks of width 32, patch 4): Qwen2.5-VL's with one windowed
and one full-attention block (``window_size`` 16: 2x2 merged patches per window) and
Qwen3-VL's with one DeepStack level and a learned 8x8 position grid. The embedding and
``lm_head`` are widened from transformers' defaults so that greedy decoding has clear
margins, and every layer's matrices to unit fan-in scale so that the context and the pixels
matter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_kunlun.demo.tiny_model import vocabulary, write_tokenizer_files
from vllm_kunlun.demo.tiny_qwen3_5 import VISION_TOKENS, VL_CHAT_TEMPLATE

SEED = 20261208
FAMILIES = ("qwen2_5_vl", "qwen3_vl")
PATCH = 4
MIN_PIXELS = 16 * 16
MAX_PIXELS = 64 * 64

TEXT: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
}
VISION: dict[str, Any] = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "patch_size": PATCH,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": TEXT["hidden_size"],
}
ARCHITECTURES = {
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
}


def _config(family: str, vocab_size: int, tied: bool) -> Any:
    import transformers

    ids = {
        name: vocab_size - len(VISION_TOKENS) + i
        for i, name in enumerate(
            (
                "vision_start_token_id",
                "vision_end_token_id",
                "image_token_id",
                "video_token_id",
            )
        )
    }
    text = {**TEXT, "vocab_size": vocab_size}
    if family == "qwen2_5_vl":
        # head_dim 16: M-RoPE sections (temporal, height, width) sum to 8
        text["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 3, 3],
        }
        vision = {**VISION, "window_size": 16, "fullatt_block_indexes": [1]}
        cls = transformers.Qwen2_5_VLConfig
    elif family == "qwen3_vl":
        # head_dim 32: one the Kunlun backend's kernels take (the vendor-path run)
        text["head_dim"] = 32
        text["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [6, 5, 5],
            "mrope_interleaved": True,
        }
        vision = {
            **VISION,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0],
        }
        cls = transformers.Qwen3VLConfig
    else:
        raise ValueError(f"family {family!r} is not one of {FAMILIES}")
    config = cls(
        text_config=text, vision_config=vision, tie_word_embeddings=tied, **ids
    )
    config.architectures = [ARCHITECTURES[family]]
    return config


def _processor_files(family: str) -> dict[str, dict]:
    processor = "Qwen2_5_VLProcessor" if family == "qwen2_5_vl" else "Qwen3VLProcessor"
    common = {
        "patch_size": PATCH,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "do_resize": True,
        "processor_class": processor,
    }
    image = {
        **common,
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        # as released Qwen2.5-VL files carry them; vLLM's Qwen2-VL processor info
        # reads these attributes
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
    }
    video = {
        **common,
        "video_processor_type": (
            "Qwen2VLVideoProcessor"
            if family == "qwen2_5_vl"
            else "Qwen3VLVideoProcessor"
        ),
        "size": {"shortest_edge": 2 * MIN_PIXELS, "longest_edge": 2 * MAX_PIXELS},
        "do_sample_frames": False,
    }
    return {
        "preprocessor_config.json": image,
        "video_preprocessor_config.json": video,
    }


def write_qwen_vl(directory: Path, family: str, tied: bool = False) -> Path:
    """Write the checkpoint, tokenizer and processor files into ``directory``."""
    import torch
    import transformers

    vocab = vocabulary() + list(VISION_TOKENS)
    config = _config(family, len(vocab), tied)
    torch.manual_seed(SEED)
    model = getattr(transformers, ARCHITECTURES[family])(config).to(torch.float32)
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(
            0.0, 0.25 if tied else 1.0, generator=gen
        )
        if not tied:
            model.lm_head.weight.normal_(0.0, 0.5, generator=gen)
        # transformers' init (std 0.02) leaves every layer's contribution near zero
        # beside the unit embeddings (the last token alone decides the answer): unit
        # fan-in scale for the layers' matrices, so that the context and the pixels
        # matter
        embed = model.get_input_embeddings().weight
        for name, param in model.named_parameters():
            if param.dim() >= 2 and param is not embed and "lm_head" not in name:
                fan_in = param[0].numel()
                param.normal_(0.0, fan_in**-0.5, generator=gen)
                if tied and name.endswith(("o_proj.weight", "down_proj.weight")):
                    # tied: a residual stream that is mostly the input embedding
                    # would repeat the input token; the layers' writes dominate
                    param.mul_(4.0)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    write_tokenizer_files(directory, vocab, VISION_TOKENS, VL_CHAT_TEMPLATE)
    for name, data in _processor_files(family).items():
        (directory / name).write_text(json.dumps(data, indent=2))
    return directory
