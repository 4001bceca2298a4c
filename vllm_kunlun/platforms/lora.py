"""LoRA on vllm-kunlun's platforms: the punica wrapper they name and the start checks.

Why: vLLM serves LoRA adapters through a per-platform punica wrapper
(``get_punica_wrapper`` returns its qualified name); the plugin's runs the LoRA seam
(``ops/lora/``: vendor bgmv kernels on Kunlun, portable batched torch elsewhere). Of the
plugin's own model classes only the causal Qwen3.5 (``Qwen3_5ForCausalLM``) declares
vLLM's ``SupportsLoRA`` and is checked against transformers with adapters merged. The
others would fail late or, worse, serve an adapter unapplied: the composite checkpoints
name their text layers ``model.language_model.*`` (a peft adapter for them would match
no module of the plugin's text model), and the MoE members' experts run the plugin's
fused MoE kernels, which have no LoRA path. They are refused at engine start, by name.
Removal: a refusal goes when its class is served with LoRA and tested so.
"""

from __future__ import annotations

from vllm.config import VllmConfig

from vllm_kunlun.models import ARCHITECTURES

PUNICA_WRAPPER = "vllm_kunlun.ops.lora.punica.PunicaWrapperKunlun"

# The plugin's architectures served with --enable-lora.
LORA_ARCHITECTURES = frozenset({"Qwen3_5ForCausalLM"})


def refuse_unsupported_lora(vllm_config: VllmConfig) -> None:
    """With ``--enable-lora``, refuse the plugin's models that are not served with LoRA."""
    if vllm_config.lora_config is None or vllm_config.model_config is None:
        return
    archs = list(getattr(vllm_config.model_config, "architectures", None) or [])
    refused = [a for a in archs if a in ARCHITECTURES and a not in LORA_ARCHITECTURES]
    if refused:
        raise ValueError(
            f"--enable-lora: {', '.join(refused)} (vllm-kunlun's implementation) is not "
            "served with LoRA adapters: the vision-language composites' text layers are "
            "named model.language_model.* and the MoE members' experts have no LoRA "
            "path. LoRA is served on Qwen3_5ForCausalLM (the causal Qwen3.5 text "
            "checkpoint) and on vLLM's own LoRA-capable models (Qwen3 dense, Qwen2, "
            "Llama, ...); serve this model without --enable-lora, or merge the adapter "
            "into its weights."
        )
