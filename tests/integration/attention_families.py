"""Tiny checkpoints of the dense decoder families, written by transformers 5.2.0's own
classes: the plain ones (Llama, Qwen2) and those whose attention needs more than causal
softmax (Gemma 2: soft-capping and sliding layers; Gemma 3: sliding layers with their
own RoPE base; Mistral: one window on every layer; gpt-oss: attention sinks,
alternating windows and vLLM's MoE layer).

Why: the family matrix (``test_e2e_family_matrix.py``) compares vLLM + the plugin with
transformers' modeling code on checkpoints exactly as transformers saves them (its own
config class and ``save_pretrained``). Test helper only: ``python attention_families.py
FAMILY DIR [SEED]`` writes one (also for held-out checks with another seed).

Windows are 8 tokens (6 for Mistral), far shorter than the long test prompts, so a
kernel that ignored them would generate other tokens (the matrix checks that
transformers' own greedy output changes without the window). The weights are
transformers' initialisation redrawn wider (seeded): linears std ``1/sqrt(fan_in)``,
routers std 3 (clear expert choices), sinks std 1.5 (they visibly take probability).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch

from vllm_kunlun.demo.tiny_model import vocabulary, write_tokenizer_files

WINDOW = 8
COMMON: dict[str, Any] = {
    "hidden_size": 128,  # heads x head_dim: vLLM's Qwen2 derives head_dim from it
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # a head size the Kunlun kernels list (vendor path)
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "intermediate_size": 96,
}


def llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM, LlamaConfig(
        **COMMON, num_hidden_layers=2, tie_word_embeddings=False
    )


def qwen2() -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM, Qwen2Config(
        **COMMON, num_hidden_layers=2, tie_word_embeddings=True
    )


def gemma2() -> Any:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        **COMMON,
        num_hidden_layers=4,  # sliding, full, sliding, full
        sliding_window=WINDOW,
        query_pre_attn_scalar=32,  # scale 1/sqrt(head_dim), as released Gemma 2
        attn_logit_softcapping=2.0,  # small enough to bite on these activations
        final_logit_softcapping=8.0,
    )
    return Gemma2ForCausalLM, config


def gemma3() -> Any:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        **COMMON,
        num_hidden_layers=4,
        sliding_window=WINDOW,
        query_pre_attn_scalar=32,
        layer_types=[
            "sliding_attention",
            "sliding_attention",
            "sliding_attention",
            "full_attention",
        ],
    )
    return Gemma3ForCausalLM, config


def mistral() -> Any:
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        **COMMON, num_hidden_layers=2, sliding_window=6, tie_word_embeddings=False
    )
    return MistralForCausalLM, config


def gpt_oss() -> Any:
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(
        # The released YaRN RoPE (factor 32 over 4096 positions) as transformers'
        # defaults give it; max positions consistent with it.
        **{**COMMON, "intermediate_size": 32, "max_position_embeddings": 131072},
        num_hidden_layers=2,  # sliding, full
        sliding_window=WINDOW,
        num_local_experts=4,
        num_experts_per_tok=2,
        tie_word_embeddings=False,
    )
    return GptOssForCausalLM, config


FAMILIES = {
    "llama": llama,
    "qwen2": qwen2,
    "gemma2": gemma2,
    "gemma3": gemma3,
    "mistral": mistral,
    "gpt_oss": gpt_oss,
}


def _redraw(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)

    def randn(shape: torch.Size, std: float) -> torch.Tensor:
        return std * torch.randn(shape, generator=gen)

    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + randn(p.shape, 0.1))
            elif name.endswith("sinks"):
                p.copy_(randn(p.shape, 1.5))
            elif name.endswith("router.weight"):
                p.copy_(randn(p.shape, 3.0 / math.sqrt(p.shape[1])))
            elif name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                p.copy_(randn(p.shape, 1.0 / math.sqrt(p.shape[-2])))  # x @ W[e]
            elif p.dim() >= 2:
                p.copy_(randn(p.shape, 1.0 / math.sqrt(p.shape[-1])))
            else:
                p.copy_(randn(p.shape, 0.1))


def write(family: str, out: str | Path, seed: int = 0) -> Path:
    """Write ``family``'s tiny checkpoint (float32) and the tokenizer into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cls, config = FAMILIES[family]()
    vocab = vocabulary()
    config.vocab_size = len(vocab)
    config.bos_token_id = None
    config.eos_token_id = None
    config.pad_token_id = None
    torch.manual_seed(seed)
    model = cls(config).to(torch.float32)
    _redraw(model, seed + 1)
    model.save_pretrained(out)
    write_tokenizer_files(out, vocab)
    return out


if __name__ == "__main__":
    print(write(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0))
