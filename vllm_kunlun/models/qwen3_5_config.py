"""What the Qwen3.5 models (dense, MoE, their MTP draft) read from vLLM's config, and
the deployments they refuse.

Why: the dense and the MoE model files share these; kept apart from both so that
neither model file imports the other for them, and so that the deployment rules sit
in one place rather than inside a model's layers. Each model's constructor calls
``refuse_unsupported`` before it builds a layer, in every process that builds it.
When it can go: with the Qwen3.5 models (when vLLM serves Qwen3.5 itself).
"""

from __future__ import annotations

from typing import Any

from vllm.config import VllmConfig


def text_config(vllm_config: VllmConfig) -> Any:
    """The text config: the checkpoint's own, or ``text_config`` of the composite."""
    return vllm_config.model_config.hf_text_config


def refuse_unsupported(vllm_config: VllmConfig, moe: bool = False) -> None:
    """Raise ``ValueError`` naming the cause and the fix for a deployment the Qwen3.5
    models do not serve: an architecture that contradicts the checkpoint's experts,
    attention bias, a speculative method other than MTP, a tensor parallel size that
    does not divide the heads (or the experts' widths), ``mamba_cache_mode='all'``."""
    config = text_config(vllm_config)
    experts = int(getattr(config, "num_experts", 0) or 0)
    if bool(experts) != moe:
        arch = vllm_config.model_config.architectures
        raise ValueError(
            f"config.json names {arch}, but its text config has num_experts="
            f"{experts}: a {'Qwen3.5-MoE' if experts else 'dense Qwen3.5'} "
            "checkpoint needs the architecture "
            f"{'Qwen3_5MoeForConditionalGeneration (or ...ForCausalLM)' if experts else 'Qwen3_5ForConditionalGeneration (or ...ForCausalLM)'}"
        )
    if getattr(config, "attention_bias", False):
        raise ValueError(
            "this Qwen3.5 config sets attention_bias=true, which released Qwen3.5 "
            "checkpoints do not use and vllm-kunlun does not implement"
        )
    _refuse_unsupported_speculation(vllm_config)
    tp = vllm_config.parallel_config.tensor_parallel_size
    for field in (
        "num_attention_heads",
        "linear_num_key_heads",
        "linear_num_value_heads",
    ):
        heads = getattr(config, field)
        if heads % tp:
            raise ValueError(
                f"this Qwen3.5 has {field}={heads}, which tensor parallel size {tp} "
                "does not divide (each rank holds an equal share of the heads); use a "
                "--tensor-parallel-size that divides "
                f"{config.num_attention_heads}, {config.linear_num_key_heads} and "
                f"{config.linear_num_value_heads}"
            )
    if moe:
        _refuse_unsupported_moe(vllm_config, config, tp)
    if vllm_config.cache_config.mamba_cache_mode == "all":
        raise ValueError(
            "Qwen3.5 supports prefix caching only in mamba_cache_mode='align'; use "
            "--mamba-cache-mode align (the default with --enable-prefix-caching)"
        )


def num_spec(vllm_config: VllmConfig) -> int:
    """Speculative tokens per step (0 without speculative decoding)."""
    spec = vllm_config.speculative_config
    return int(spec.num_speculative_tokens or 0) if spec is not None else 0


def _refuse_unsupported_speculation(vllm_config: VllmConfig) -> None:
    spec = vllm_config.speculative_config
    if spec is None or spec.method == "mtp":
        return
    raise ValueError(
        f"speculative method {spec.method!r} on Qwen3.5: vllm-kunlun serves Qwen3.5 "
        "speculative decoding with its own multi-token-prediction head only; use "
        '--speculative-config \'{"method": "mtp", "num_speculative_tokens": N}\''
    )


def _refuse_unsupported_moe(vllm_config: VllmConfig, config: Any, tp: int) -> None:
    ep = bool(getattr(vllm_config.parallel_config, "enable_expert_parallel", False))
    fields = ["shared_expert_intermediate_size"]
    fields.append("num_experts" if ep else "moe_intermediate_size")
    for field in fields:
        value = int(getattr(config, field))
        if value % tp:
            how = (
                "with --enable-expert-parallel each rank holds num_experts / TP whole "
                "experts"
                if field == "num_experts"
                else "each rank holds an equal share of every expert's width"
            )
            raise ValueError(
                f"this Qwen3.5-MoE has {field}={value}, which tensor parallel size "
                f"{tp} does not divide ({how}); use a --tensor-parallel-size that "
                "divides it"
            )
    if not 0 < int(config.num_experts_per_tok) <= int(config.num_experts):
        raise ValueError(
            f"this Qwen3.5-MoE config routes num_experts_per_tok="
            f"{config.num_experts_per_tok} of num_experts={config.num_experts}; it "
            "must be between 1 and num_experts"
        )
