"""The dtypes of a Gated DeltaNet layer's two states: the short conv window and the
recurrent (SSM) state, one rule for the model, the engine guard, the KV budget and the
doctor.

Why: vLLM 0.15.1 keeps both GDN states in ``--mamba-cache-dtype`` ('auto': the model
dtype) and reads ``--mamba-ssm-cache-dtype`` only for Mamba layers. Every released
Qwen3.5 / Qwen3-Next config says ``"mamba_ssm_dtype": "float32"``, transformers keeps
the recurrent state in float32, and the deployment log's engine held 4.69 GiB of GDN
state at 256 sequences: float32. A bf16 / fp16 recurrent state is a silent precision
loss that grows with the sequence (the state is a running sum over every token).
Rule: the recurrent state takes ``--mamba-ssm-cache-dtype`` when the operator set it,
else the checkpoint's ``mamba_ssm_dtype``, else what the conv state takes. The conv
state takes ``--mamba-cache-dtype`` ('auto': the model dtype), as in vLLM.
Removal: when vLLM applies ``mamba_ssm_cache_dtype`` and the checkpoint's
``mamba_ssm_dtype`` to GDN layers itself.

Strings only (no torch): the doctor uses it on a machine without the stack.
"""

from __future__ import annotations

from typing import Any

STATE_DTYPES = ("float32", "bfloat16", "float16")


def _name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def checkpoint_ssm_dtype(config: Any) -> str | None:
    """The checkpoint's ``mamba_ssm_dtype`` (a config object or a dict; its
    ``text_config`` first for a composite), or None when it names no float dtype."""
    for source in (_get(config, "text_config"), config):
        value = _get(source, "mamba_ssm_dtype")
        if value is not None and _name(value) in STATE_DTYPES:
            return _name(value)
    return None


def _get(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def gdn_state_dtypes(
    model_dtype: Any,
    mamba_cache_dtype: str = "auto",
    mamba_ssm_cache_dtype: str = "auto",
    checkpoint_dtype: str | None = None,
) -> tuple[str, str]:
    """(conv state dtype, recurrent state dtype) as dtype names."""
    conv = (
        _name(model_dtype) if mamba_cache_dtype in ("", "auto") else mamba_cache_dtype
    )
    if mamba_ssm_cache_dtype not in ("", "auto"):
        return conv, _name(mamba_ssm_cache_dtype)
    return conv, checkpoint_dtype or conv


def gdn_state_dtypes_for(model: Any, cache: Any) -> tuple[str, str]:
    """The rule applied to an engine's model and cache configs (vLLM's
    ``ModelConfig`` / ``CacheConfig``: model dtype, cache flags, checkpoint)."""
    return gdn_state_dtypes(
        model.dtype,
        str(getattr(cache, "mamba_cache_dtype", "auto") or "auto"),
        str(getattr(cache, "mamba_ssm_cache_dtype", "auto") or "auto"),
        checkpoint_ssm_dtype(model.hf_config),
    )
