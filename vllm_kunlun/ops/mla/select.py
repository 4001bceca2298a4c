"""Selection of the plugin's MLA backend for vLLM's ``use_mla`` layers.

Why: both platforms route every MLA layer (DeepSeek-V2/V3/R1, Kimi-K2) here, one
backend (``backend.py``) whose kernels ``seam.py`` picks per device, and refuse what
it cannot serve with the reason: DeepSeek-V3.2's sparse attention (its DSA indexer
and top-k cache), quantized latent caches, a named backend that needs CUDA.
Importing this module stays cheap: the backend module is loaded by vLLM on use.
"""

from __future__ import annotations

from typing import Any

MLA_BACKEND_PATH = "vllm_kunlun.ops.mla.backend.PluginMLABackend"

SPARSE_REFUSAL = (
    "DeepSeek-V3.2's sparse attention (the DSA lightning indexer choosing top-k "
    "cached tokens per query) is not served {where}: the plugin's MLA backend is "
    "dense. Serve a dense MLA model (DeepSeek-V3 / V3.1 / R1, Kimi-K2)."
)


def select_mla(selected: Any, attn_selector_config: Any, where: str) -> str:
    """The class path for an MLA layer, or a ValueError naming why not.

    ``selected``: the backend named with ``--attention-backend`` (None: default);
    only ``CUSTOM`` (the plugin's) or none is accepted, vLLM's MLA backends need
    CUDA / ROCm binaries.
    """
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_kunlun.logger import init_logger

    if attn_selector_config.use_sparse:
        raise ValueError(SPARSE_REFUSAL.format(where=where))
    if selected is not None and selected != AttentionBackendEnum.CUSTOM:
        raise ValueError(
            f"Attention backend {selected.name} cannot serve MLA layers {where}: "
            "vLLM's MLA backends need CUDA / ROCm binaries. Leave "
            "--attention-backend unset (the plugin's MLA backend serves them)."
        )
    backend = resolve_obj_by_qualname(MLA_BACKEND_PATH)
    reasons = backend.validate_configuration(
        device_capability=None, **attn_selector_config._asdict()
    )
    if reasons:
        raise ValueError(
            f"The vllm-kunlun MLA backend cannot serve this layer {where}: "
            f"{', '.join(reasons)} ({attn_selector_config!r}). It serves dense MLA "
            "with kv_cache_dtype auto in float16 / bfloat16 / float32."
        )
    init_logger(__name__).info_once(
        "vllm-kunlun: MLA attention backend %s %s", MLA_BACKEND_PATH, where
    )
    return MLA_BACKEND_PATH
