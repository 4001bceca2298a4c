"""Tiny checkpoints of vLLM's MoE families, written by transformers 5.2.0's own classes.

Why: the families vLLM builds on its ``FusedMoE`` layer (Qwen3-MoE, Mixtral, GLM-4.5)
need checkpoints exactly as transformers saves them (its own config class, its own
``save_pretrained``, its expert layout) to test the plugin's MoE method against
transformers' modeling code. Test helper only: ``python moe_families.py FAMILY DIR
[SEED]`` writes one (also used for held-out checks with another seed).

The weights are transformers' initialisation redrawn wider (seeded): linears std
``1/sqrt(fan_in)`` so the activations neither vanish nor explode, the router std 3 so
each token prefers a few experts clearly (float noise does not flip an expert choice)
while different tokens reach different experts, and GLM's correction bias spread so it
changes some choices. The tokenizer is the tiny word-level one every tiny checkpoint
shares.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from vllm_kunlun.demo.tiny_model import vocabulary, write_tokenizer_files

COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}


def qwen3_moe(num_experts: int = 8, top_k: int = 2, width: int = 32) -> Any:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        **COMMON,
        intermediate_size=96,
        moe_intermediate_size=width,
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )
    return Qwen3MoeForCausalLM, config


def mixtral(num_experts: int = 8, top_k: int = 2, width: int = 48) -> Any:
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        **COMMON,
        intermediate_size=width,
        num_local_experts=num_experts,
        num_experts_per_tok=top_k,
    )
    return MixtralForCausalLM, config


def glm4_moe(num_experts: int = 16, top_k: int = 4, width: int = 32) -> Any:
    """GLM-4.5's layout: a dense first layer, then sigmoid-scored grouped routing with
    the correction bias, routed scaling and a shared expert."""
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    config = Glm4MoeConfig(
        **{**COMMON, "num_hidden_layers": 3},
        intermediate_size=96,
        moe_intermediate_size=width,
        n_routed_experts=num_experts,
        num_experts_per_tok=top_k,
        n_shared_experts=1,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        partial_rotary_factor=0.5,
        use_qk_norm=True,
    )
    return Glm4MoeForCausalLM, config


def _mla(
    kv_lora_rank: int, rope: int, nope: int, v_head: int, heads: int
) -> dict[str, Any]:
    """DeepSeek's multi-head latent attention geometry (no GQA: K/V come from the
    latent per head)."""
    return {
        **{k: v for k, v in COMMON.items() if k != "head_dim"},
        "num_hidden_layers": 3,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "kv_lora_rank": kv_lora_rank,
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": nope,
        "v_head_dim": v_head,
        "first_k_dense_replace": 1,
        "intermediate_size": 96,
    }


def deepseek_v2(
    kv_lora_rank: int = 32,
    rope: int = 16,
    nope: int = 16,
    v_head: int = 24,
    heads: int = 4,
    num_experts: int = 8,
    top_k: int = 2,
    width: int = 32,
) -> Any:
    """DeepSeek-V2-Lite's layout: no q LoRA (``q_proj`` straight from the hidden
    state), softmax top-k routing without renormalisation, two shared experts, a dense
    first layer."""
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    config = DeepseekV2Config(
        **_mla(kv_lora_rank, rope, nope, v_head, heads),
        q_lora_rank=None,
        moe_intermediate_size=width,
        n_routed_experts=num_experts,
        num_experts_per_tok=top_k,
        n_shared_experts=2,
        topk_method="greedy",
        norm_topk_prob=False,
        routed_scaling_factor=1.0,
    )
    return DeepseekV2ForCausalLM, config


def deepseek_v3(
    kv_lora_rank: int = 32,
    rope: int = 16,
    nope: int = 16,
    v_head: int = 24,
    heads: int = 4,
    q_lora_rank: int = 48,
    num_experts: int = 16,
    top_k: int = 4,
    width: int = 32,
) -> Any:
    """DeepSeek-V3 / R1's layout: q LoRA (``q_a_proj``, its norm, ``q_b_proj``),
    sigmoid-scored grouped top-k with the correction bias, routed scaling 2.5, one
    shared expert, a dense first layer."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(
        **_mla(kv_lora_rank, rope, nope, v_head, heads),
        q_lora_rank=q_lora_rank,
        moe_intermediate_size=width,
        n_routed_experts=num_experts,
        num_experts_per_tok=top_k,
        n_shared_experts=1,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
    )
    return DeepseekV3ForCausalLM, config


FAMILIES = {"qwen3_moe": qwen3_moe, "mixtral": mixtral, "glm4_moe": glm4_moe}
FAMILIES |= {"deepseek_v2": deepseek_v2, "deepseek_v3": deepseek_v3}


def _redraw(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("e_score_correction_bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith("gate.weight") and p.dim() == 2 and "proj" not in name:
                p.copy_(
                    3.0 * torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1])
                )
            elif p.dim() >= 2:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn(b.shape, generator=gen))


def write(family: str, out: str | Path, seed: int = 0, **shape: Any) -> Path:
    """Write ``family``'s tiny checkpoint (float32) and the tokenizer into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cls, config = FAMILIES[family](**shape)
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


def add_mtp_layer(out: str | Path, seed: int = 7) -> Path:
    """Give a DeepSeek checkpoint written by ``write`` one multi-token-prediction layer,
    as DeepSeek-V3 ships it: the tensors of layer ``num_hidden_layers`` (``enorm``,
    ``hnorm``, ``eh_proj``, ``shared_head.norm/head``, its own ``embed_tokens`` and a
    whole decoder layer) and ``num_nextn_predict_layers: 1`` in config.json.

    transformers has no MTP head (it ignores these tensors), so they are added here:
    the decoder layer is a copy of the last one, the embeddings, final norm and head
    are the model's own, and ``eh_proj`` passes the target's hidden state through
    (plus the next token's embedding, scaled down), so the draft is the target's own
    guess continued by one more layer and agrees with the target now and then."""
    from safetensors.torch import load_file, save_file

    out = Path(out)
    config = json.loads((out / "config.json").read_text())
    n, hidden = config["num_hidden_layers"], config["hidden_size"]
    path = out / "model.safetensors"
    tensors = load_file(str(path))
    last, mtp = f"model.layers.{n - 1}.", f"model.layers.{n}."
    for name, t in list(tensors.items()):
        if name.startswith(last):
            tensors[mtp + name[len(last) :]] = t.clone()
    gen = torch.Generator().manual_seed(seed)
    eye = torch.eye(hidden)
    noise = torch.randn(hidden, hidden, generator=gen) / (10 * math.sqrt(hidden))
    tensors[mtp + "eh_proj.weight"] = torch.cat([0.1 * eye, eye + noise], dim=1)
    tensors[mtp + "enorm.weight"] = torch.ones(hidden)
    tensors[mtp + "hnorm.weight"] = torch.ones(hidden)
    tensors[mtp + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors[mtp + "shared_head.norm.weight"] = tensors["model.norm.weight"].clone()
    tensors[mtp + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(
        {k: v.contiguous() for k, v in tensors.items()}, str(path), {"format": "pt"}
    )
    config["num_nextn_predict_layers"] = 1
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


if __name__ == "__main__":
    print(write(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0))
