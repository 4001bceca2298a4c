"""What the Qwen3.5 models (dense, MoE, their MTP draft) read from vLLM's config.

Why: the dense and the MoE model files share these; kept apart from both so that
neither model file imports the other for them. The deployments the Qwen3.5 models
refuse are engine-start guards (``vllm_kunlun/guards/qwen3_5_deployment.py``).
When it can go: with the Qwen3.5 models (when vLLM serves Qwen3.5 itself).
"""

from __future__ import annotations

from typing import Any

from vllm.config import VllmConfig


def text_config(vllm_config: VllmConfig) -> Any:
    """The text config: the checkpoint's own, or ``text_config`` of the composite."""
    return vllm_config.model_config.hf_text_config


def num_spec(vllm_config: VllmConfig) -> int:
    """Speculative tokens per step (0 without speculative decoding)."""
    spec = vllm_config.speculative_config
    return int(spec.num_speculative_tokens or 0) if spec is not None else 0
