"""Which attention backend would serve a model's attention layers on this host, and at
what page and kernel block.

Why: a hybrid model's attention page is whatever multiple of 16 tokens holds one GDN
state (400 for the log's 27B at TP 8); a backend that refused that page used to lose
the vendor kernels without a word. The doctor asks the same selection the engine runs
(the platform class's ``get_attn_backend_cls``) and vLLM's kernel-block rule
(``attention.kernel_block_size``), so the report names what the engine will do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_kunlun import envs


@dataclass(frozen=True)
class AttentionPath:
    block_size: int
    """The KV manager's block (the hybrid page, or the configured block size)."""
    backend: str | None
    """Class path of the backend the platform selects; None when selection refused."""
    kernel_block_size: int | None
    """The block the kernels index; None: vLLM's runner finds none ("No common block
    size") or selection refused."""
    platform: str
    why: str = ""


def platform_class() -> Any:
    """The plugin platform the engine would run on this host: the plugin's own
    selection (``hardware.select_platform``), KunlunPlatform when it picks none (no
    device visible: a P800 assumed, as the budget does)."""
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from vllm_kunlun.hardware import KUNLUN_PLATFORM, select_platform

    return resolve_obj_by_qualname(select_platform().platform or KUNLUN_PLATFORM)


def attention_path(
    *,
    head_size: int,
    dtype: str,
    block_size: int,
    platform: Any = None,
    use_mla: bool = False,
) -> AttentionPath:
    """``use_mla``: the layers are multi-head latent attention (``head_size`` is then
    the latent row, ``kv_lora_rank + qk_rope_head_dim``)."""
    import torch
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.attention.selector import AttentionSelectorConfig

    from vllm_kunlun.ops.attention.block_sizes import kernel_block_size

    plat = platform or platform_class()
    if envs.VLLM_KUNLUN_HOST_EMULATION and platform is None:
        dtype = "float32"  # the only dtype emulation runs
    torch_dtype = getattr(torch, dtype, None)
    selector = AttentionSelectorConfig(
        head_size=head_size,
        dtype=torch_dtype if isinstance(torch_dtype, torch.dtype) else torch.bfloat16,
        kv_cache_dtype="auto",
        block_size=block_size,
        use_mla=use_mla,
    )
    try:
        path = plat.get_attn_backend_cls(None, selector)
        backend = resolve_obj_by_qualname(path)
    except Exception as exc:  # the selection's own refusal, reported as such
        return AttentionPath(block_size, None, None, plat.__name__, f"{exc}")
    kernel = kernel_block_size(backend, block_size)
    return AttentionPath(block_size, path, kernel, plat.__name__)
