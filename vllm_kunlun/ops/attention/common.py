"""What the plugin's attention backends share in vLLM's backend interface.

Why: the portable backend (``backend.py``) and the Kunlun backend (``kunlun.py``) are
both decoder-only paged backends that vLLM can only know as ``CUSTOM``. The answers
vLLM asks the class for (name, dtypes, cascade, attention types, impl and builder
classes, cache shape), the batch order of their metadata builders, the layer checks
made when a model is built and vLLM's ``forward`` call up to the kernels are the same;
only the refusal words, the cache layout and the kernels (each backend's ``attend``)
differ. The MLA backend (``ops/mla/backend.py``) is a ``CUSTOM`` backend too: it takes
the class answers (``PluginBackendAnswers``) and the builder's batch order from here. Per-layer sliding windows, logit
soft-capping and attention sinks are accepted here and kept on the impl
(``sliding_window``, ``logits_soft_cap``, ``sinks``) for the kernels.

Removal: with the backends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionLayer,
    AttentionMetadata,
    AttentionMetadataBuilder,
    AttentionType,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.cache import CacheDType
    from vllm.v1.kv_cache_interface import AttentionSpec

M = TypeVar("M", bound=AttentionMetadata)

# vLLM's only name for an out-of-tree backend; the layer maps get_name() back to it.
BACKEND_NAME = "CUSTOM"


class PluginBackendAnswers:
    """What vLLM asks every plugin backend class, answered the same way: the name
    (``CUSTOM``), dtypes, no cascade attention, the attention types in ``ATTN_TYPES``,
    and the impl and builder classes named by ``IMPL`` / ``BUILDER``. Listed first in
    a backend's bases, before vLLM's backend class."""

    accept_output_buffer: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [
        torch.float16,
        torch.bfloat16,
        torch.float32,
    ]
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = ["auto"]
    # the attention types a backend serves (the portable one adds ENCODER_ONLY)
    ATTN_TYPES: ClassVar[tuple[str, ...]] = (AttentionType.DECODER,)
    IMPL: ClassVar[type[Any]]
    BUILDER: ClassVar[type[Any]]

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def use_cascade_attention(*args: Any, **kwargs: Any) -> bool:
        return False

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type in cls.ATTN_TYPES

    @classmethod
    def get_impl_cls(cls) -> type[Any]:
        return cls.IMPL

    @classmethod
    def get_builder_cls(cls) -> type[Any]:
        return cls.BUILDER


class PluginAttentionBackend(PluginBackendAnswers, AttentionBackend):
    forward_includes_kv_cache_update: bool = True
    # The cache dimensions in order: a parameter name of ``get_kv_cache_shape`` or a
    # fixed size (2: the key and the value halves).
    KV_CACHE_LAYOUT: ClassVar[tuple[str | int, ...]]

    @classmethod
    def get_kv_cache_shape(
        cls,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        sizes = {
            "num_blocks": num_blocks,
            "block_size": block_size,
            "num_kv_heads": num_kv_heads,
            "head_size": head_size,
        }
        return tuple(
            sizes[dim] if isinstance(dim, str) else dim for dim in cls.KV_CACHE_LAYOUT
        )

    @classmethod
    def supports_sink(cls) -> bool:
        # Both backends attend with sinks (the Kunlun one on the portable kernel).
        return True

    @classmethod
    def supports_block_size(cls, block_size: int | None) -> bool:
        # vLLM's base method also requires one of the literal BlockSize values, which
        # hybrid pages (48, 400, 544 tokens, ...) are not; what matters is whether the
        # model runner can split the page into this backend's kernel blocks.
        from vllm_kunlun.ops.attention.block_sizes import kernel_block_size

        return block_size is None or kernel_block_size(cls, block_size) is not None


class DecodesFirstMetadataBuilder(AttentionMetadataBuilder[M]):
    """vLLM puts requests with one new token (decodes) first; no CUDA graphs (the
    metadata is planned on the host every step)."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        self._init_reorder_batch_threshold(1)


class PluginAttentionImpl(AttentionImpl[M]):
    """The layer checks and attributes both backends share.

    ``WHY`` says, per refused feature, why (and what to do instead) in the backend's
    words; ``refusal`` words the error.
    """

    DISPLAY_NAME: ClassVar[str]
    WHY: ClassVar[dict[str, str]]
    ATTN_TYPES: ClassVar[tuple[str, ...]] = (AttentionType.DECODER,)

    @classmethod
    def refusal(cls, what: str, why: str) -> NotImplementedError:
        return NotImplementedError(f"{cls.DISPLAY_NAME} does not support {what}. {why}")

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
        **extra: Any,
    ) -> None:
        why = self.WHY
        self.attn_type = attn_type
        if attn_type not in self.ATTN_TYPES:
            kind = getattr(attn_type, "value", attn_type)
            raise self.refusal(f"{kind} attention", why["attn_type"])
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window={sliding_window} must be positive")
        if alibi_slopes is not None:
            raise self.refusal("ALiBi", why["alibi"])
        if sinks is not None and sinks.numel() != num_heads:
            raise ValueError(
                f"attention sinks of shape {tuple(sinks.shape)}: one per query head "
                f"({num_heads}) expected"
            )
        if kv_cache_dtype != "auto":
            raise self.refusal(
                f"kv_cache_dtype={kv_cache_dtype!r}", why["kv_cache_dtype"]
            )
        unknown = sorted(k for k, v in extra.items() if v not in (None, False))
        if unknown:
            raise self.refusal(f"the attention options {unknown}", why["attn_type"])
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={num_heads} is not a multiple of "
                f"num_kv_heads={num_kv_heads}"
            )
        self.logits_soft_cap = logits_soft_cap or None
        # Keys ``p - window < j <= p`` for a query at ``p`` (None: all of them).
        self.sliding_window = sliding_window
        # One logit per query head joining the softmax denominator (gpt-oss). vLLM's
        # layer owns the parameter; the weights are loaded into it after this call.
        self.sinks = sinks
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name

    def forward(
        self,
        layer: AttentionLayer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: M,
        output: torch.Tensor | None = None,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """vLLM's call: the shared prologue (``begin_forward``), then the backend's
        kernels (``attend``), except in vLLM's warm-up run."""
        output = self.begin_forward(
            output, output_scale, output_block_scale, attn_metadata
        )
        if attn_metadata is None:
            return output
        return self.attend(query, key, value, kv_cache, attn_metadata, output)

    def attend(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The backend's kernels: one step's attention, ``(query, key, value, kv_cache,
        attn_metadata, output)``, written into ``output`` and returned."""
        raise NotImplementedError

    def begin_forward(
        self,
        output: torch.Tensor | None,
        output_scale: torch.Tensor | None,
        output_block_scale: torch.Tensor | None,
        attn_metadata: M | None,
    ) -> torch.Tensor:
        """The output buffer to fill; zeroed for vLLM's warm-up run (no metadata, no
        KV cache bound yet), which the caller then returns as it is."""
        if output is None:
            raise ValueError(f"{self.DISPLAY_NAME} needs the output buffer from vLLM")
        if output_scale is not None or output_block_scale is not None:
            raise self.refusal(
                "fused output quantization", "Disable the attention fusion pass."
            )
        if attn_metadata is None:
            output.fill_(0)
        return output
