"""Start-time refusals of the Qwen3.5 deployments vllm-kunlun does not serve.

Why: the plugin's Qwen3.5 models (dense and MoE, causal or composite) shard every head
group and expert width evenly over the tensor-parallel ranks, implement no attention
bias, draft only with their own multi-token-prediction head and keep prefix-cached
state only in ``mamba_cache_mode='align'``; another deployment would fail deep inside
a layer or generate wrong tokens. Refused before vLLM builds anything, naming the cause
and the fix.

How: ``qwen3_5_deployment_guard`` runs in the engine-start guards
(``engine_checks.check_engine_config``, from the platform's ``check_and_update_config``)
when the architecture vLLM resolved is one of the plugin's Qwen3.5 targets
(``QWEN3_5_TARGETS``; the MTP drafts follow their target); ``refuse_unsupported`` raises
``ValueError`` for the first rule the deployment breaks.

Removal: with the Qwen3.5 models (when vLLM serves Qwen3.5 itself).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.config import VllmConfig

# The Qwen3.5 architectures the plugin registers (models/__init__.py) -> whether the
# class serves the MoE members.
QWEN3_5_TARGETS = {
    "Qwen3_5ForCausalLM": False,
    "Qwen3_5ForConditionalGeneration": False,
    "Qwen3_5MoeForCausalLM": True,
    "Qwen3_5MoeForConditionalGeneration": True,
}


def qwen3_5_deployment_guard(vllm_config: VllmConfig) -> None:
    """``refuse_unsupported`` for an engine that serves one of the plugin's Qwen3.5
    architectures; nothing for any other model."""
    model_config = vllm_config.model_config
    if model_config is None:
        return
    moe = QWEN3_5_TARGETS.get(getattr(model_config, "architecture", None) or "")
    if moe is not None:
        refuse_unsupported(vllm_config, moe)


def refuse_unsupported(vllm_config: VllmConfig, moe: bool = False) -> None:
    """Raise ``ValueError`` naming the cause and the fix for a deployment the Qwen3.5
    models do not serve: an architecture that contradicts the checkpoint's experts,
    attention bias, a speculative method other than MTP, a tensor parallel size that
    does not divide the heads (or the experts' widths), ``mamba_cache_mode='all'``."""
    # The text config: the checkpoint's own, or ``text_config`` of the composite.
    config = vllm_config.model_config.hf_text_config
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
    refuse_unsupported_speculation(vllm_config)
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
        refuse_unsupported_moe(vllm_config, config, tp)
    if vllm_config.cache_config.mamba_cache_mode == "all":
        raise ValueError(
            "Qwen3.5 supports prefix caching only in mamba_cache_mode='align'; use "
            "--mamba-cache-mode align (the default with --enable-prefix-caching)"
        )


def refuse_unsupported_speculation(vllm_config: VllmConfig) -> None:
    """Refuse a speculative method other than the Qwen3.5 MTP head."""
    spec = vllm_config.speculative_config
    if spec is None or spec.method == "mtp":
        return
    raise ValueError(
        f"speculative method {spec.method!r} on Qwen3.5: vllm-kunlun serves Qwen3.5 "
        "speculative decoding with its own multi-token-prediction head only; use "
        '--speculative-config \'{"method": "mtp", "num_speculative_tokens": N}\''
    )


def refuse_unsupported_moe(vllm_config: VllmConfig, config: Any, tp: int) -> None:
    """Refuse expert widths (or, with expert parallelism, expert counts) the tensor
    parallel size does not divide, and a top-k outside 1..num_experts."""
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
