"""LoRA on vllm-kunlun's platforms: the punica wrapper they name and the start checks.

Why: vLLM serves LoRA adapters through a per-platform punica wrapper
(``get_punica_wrapper`` returns its qualified name); the plugin's runs the LoRA seam
(``ops/lora/``: vendor bgmv kernels on Kunlun, portable batched torch elsewhere). The
plugin's own Qwen3.5 model classes do not implement vLLM's ``SupportsLoRA`` (their GDN
layers have no LoRA wrappers in vLLM 0.15.1), and vLLM would only find that out in the
worker after loading the weights; this refuses them at engine start, by name.
Removal: the refusal goes when the Qwen3.5 classes declare ``SupportsLoRA``.
"""

from __future__ import annotations

from vllm.config import VllmConfig

from vllm_kunlun.models import ARCHITECTURES

PUNICA_WRAPPER = "vllm_kunlun.ops.lora.punica.PunicaWrapperKunlun"


def refuse_unsupported_lora(vllm_config: VllmConfig) -> None:
    """With ``--enable-lora``, refuse the plugin's models that have no LoRA layers."""
    if vllm_config.lora_config is None or vllm_config.model_config is None:
        return
    archs = list(getattr(vllm_config.model_config, "architectures", None) or [])
    ours = [arch for arch in archs if arch in ARCHITECTURES]
    if ours:
        raise ValueError(
            f"--enable-lora: {', '.join(ours)} (vllm-kunlun's Qwen3.5 implementation) "
            "has no LoRA layers yet, so adapters cannot be served on it. LoRA is "
            "served on vLLM's own LoRA-capable models (Qwen3 dense, Qwen2, Llama, ...); "
            "serve this model without --enable-lora, or merge the adapter into its "
            "weights."
        )
