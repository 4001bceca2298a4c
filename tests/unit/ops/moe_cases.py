"""Small MoE cases the MoE unit tests share (test_moe_portable.py, test_moe_seam.py):
transformers' own Qwen3.5-MoE sparse block built small with random weights, its inputs,
its router and expert weights as vLLM lays them out, and per-output-channel int8
quantization of expert weights."""

from __future__ import annotations

import torch
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as hf
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import (
    Qwen3_5MoeTextConfig,
)


def config(experts: int, top_k: int, hidden: int, inter: int) -> Qwen3_5MoeTextConfig:
    cfg = Qwen3_5MoeTextConfig(
        hidden_size=hidden,
        num_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=inter,
        shared_expert_intermediate_size=inter,
    )
    cfg._experts_implementation = "eager"  # transformers' own loop, as in its models
    return cfg


def block(
    experts: int, top_k: int, hidden: int, inter: int, seed: int = 0
) -> hf.Qwen3_5MoeSparseMoeBlock:
    torch.manual_seed(seed)
    moe = hf.Qwen3_5MoeSparseMoeBlock(config(experts, top_k, hidden, inter))
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.3)
    return moe.eval()


def inputs(tokens: int, hidden: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed))


def weights(moe: hf.Qwen3_5MoeSparseMoeBlock) -> tuple[torch.Tensor, ...]:
    return (
        moe.gate.weight.detach(),
        moe.experts.gate_up_proj.detach(),
        moe.experts.down_proj.detach(),
    )


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] -> int8 and float32 per-output-channel scales [E, N] (absmax / 127)."""
    scale = w.abs().amax(dim=-1) / 127.0
    q = torch.round(w / scale.unsqueeze(-1)).clamp(-128, 127).to(torch.int8)
    return q, scale.float()
