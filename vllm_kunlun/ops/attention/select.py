"""Selection of the plugin's attention backends: portable paged attention (plain
torch, any device, ``backend.py``) and the Kunlun backend on the vendor kernels
(``kunlun.py``).

vLLM 0.15.1 selects out-of-tree attention backends by one name, ``CUSTOM``
(``--attention-backend CUSTOM``), whose class path is looked up in a per-process
override table. ``register()`` fills that entry with our backend; the plugin's platforms
call it in every process, so the name resolves in the engine core and in each worker.
Importing this module stays cheap: the backend module is loaded by vLLM on use.

Page sizes: vLLM's KV manager gives a hybrid model (attention beside GDN/Mamba layers)
an attention page of whatever multiple of 16 tokens holds one recurrent state (48, 400,
544, ...), outside the literal ``BlockSize`` list that vLLM's base
``AttentionBackend.supports_block_size`` checks. Each backend here declares the kernel
block sizes it runs (``get_supported_kernel_block_sizes``) and accepts any manager block
its model runner can split into them (``kernel_block_size``, vLLM's
``select_common_block_size`` for one backend), so selection never refuses a page the
engine would serve.
"""

from __future__ import annotations

from typing import Any

from vllm_kunlun.ops.attention.block_sizes import block_size_reason

PORTABLE_BACKEND_PATH = "vllm_kunlun.ops.attention.backend.PortableAttentionBackend"


def _reasons(backend: Any, attn_selector_config: Any) -> list[str]:
    """vLLM's ``validate_configuration`` for this layer, the block size in words."""
    reasons = backend.validate_configuration(
        device_capability=None, **attn_selector_config._asdict()
    )
    block = block_size_reason(backend, attn_selector_config.block_size)
    return [block if r == "block_size not supported" and block else r for r in reasons]


def register() -> str:
    """Point ``AttentionBackendEnum.CUSTOM`` at the portable backend; returns the path
    CUSTOM resolves to.

    Idempotent. A CUSTOM backend registered by someone else is kept (with a warning
    naming it): the single CUSTOM slot is theirs to fill.
    """
    from vllm.v1.attention.backends.registry import (
        AttentionBackendEnum,
        register_backend,
    )

    from vllm_kunlun.logger import init_logger

    custom = AttentionBackendEnum.CUSTOM
    if custom.is_overridden():
        current = custom.get_path()
        if current != PORTABLE_BACKEND_PATH:
            init_logger(__name__).warning_once(
                "vllm-kunlun: attention backend CUSTOM is already registered as %s; "
                "keeping it (the portable backend is %s)",
                current,
                PORTABLE_BACKEND_PATH,
            )
        return current
    register_backend(custom, PORTABLE_BACKEND_PATH)
    return PORTABLE_BACKEND_PATH


def select_portable(attn_selector_config: Any) -> str:
    """The class path for ``--attention-backend CUSTOM`` (or host emulation's default).

    Registers the portable backend, then checks the layer against it so that what it
    does not support (encoder attention, fp8 KV cache, ...) fails at model build
    with the reasons instead of deep inside a forward pass.
    """
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from vllm_kunlun.logger import init_logger

    path = register()
    if path != PORTABLE_BACKEND_PATH:
        return path  # someone else's CUSTOM backend, chosen explicitly
    backend = resolve_obj_by_qualname(path)
    reasons = _reasons(backend, attn_selector_config)
    if reasons:
        raise ValueError(
            "The vllm-kunlun portable attention backend (CUSTOM) cannot serve this "
            f"layer: {', '.join(reasons)} ({attn_selector_config!r}). It handles "
            "decoder-only causal "
            "and encoder-only attention with GQA, kv_cache_dtype auto, "
            "float16/bfloat16/float32."
        )
    init_logger(__name__).info_once(
        "vllm-kunlun: attention backend CUSTOM = portable paged attention (torch)"
    )
    return path


def select_kunlun(attn_selector_config: Any) -> tuple[str | None, str]:
    """(class path, why) of the Kunlun backend for this layer, or (None, why not).

    Not when ``kunlun_ops`` lacks one of its kernels or the layer is one the backend
    refuses at selection (encoder attention, quantized KV cache, ...).
    """
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from vllm_kunlun.ops import vendor
    from vllm_kunlun.ops.attention.paged_vendor import ATTENTION_KERNELS
    from vllm_kunlun.ops.routes import VENDOR_MODULE

    for name in ATTENTION_KERNELS:
        fn, why = vendor.function(VENDOR_MODULE, name)
        if fn is None:
            return None, why
    from vllm_kunlun.ops.attention.kunlun import BACKEND_PATH

    backend = resolve_obj_by_qualname(BACKEND_PATH)
    reasons = _reasons(backend, attn_selector_config)
    if reasons:
        return None, f"it cannot serve {attn_selector_config!r}: {', '.join(reasons)}"
    return BACKEND_PATH, f"{VENDOR_MODULE} has {', '.join(ATTENTION_KERNELS)}"
