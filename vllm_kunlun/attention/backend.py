"""vLLM attention backend over ``paged.py``: portable paged attention in plain torch.

Why: host emulation has no usable attention backend (vLLM's CPU_ATTN needs ``vllm._C``),
and a CUDA-compatible device without vendor kernels needs one that runs anywhere. This
backend covers decoder-only causal attention with GQA, chunked prefill and prefix
caching; anything else is refused when the layer is built, with the reason.

vLLM knows out-of-tree backends only as ``AttentionBackendEnum.CUSTOM``; the layer maps
``get_name()`` back to the enum, so the name is ``CUSTOM`` (see ``__init__.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionLayer,
    AttentionMetadata,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

from vllm_kunlun.attention import paged
from vllm_kunlun.logger import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.cache import CacheDType
    from vllm.v1.kv_cache_interface import AttentionSpec

logger = init_logger(__name__)

BACKEND_NAME = "CUSTOM"
DISPLAY_NAME = "vllm-kunlun portable paged attention (torch)"


@dataclass
class PortableAttentionMetadata(AttentionMetadata):
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    plan: paged.AttentionPlan


class PortableAttentionMetadataBuilder(
    AttentionMetadataBuilder[PortableAttentionMetadata]
):
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
        # Decodes first: they form one cheap group with a single query row each.
        self._init_reorder_batch_threshold(1)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> PortableAttentionMetadata:
        m = common_attn_metadata
        num_decodes, _, _, _ = split_decodes_and_prefills(
            m, decode_threshold=self.reorder_batch_threshold or 1
        )
        plan = paged.plan_step(
            m.query_start_loc[: m.num_reqs + 1],
            m.query_start_loc_cpu[: m.num_reqs + 1],
            m.seq_lens[: m.num_reqs],
            m.block_table_tensor[: m.num_reqs],
            m.slot_mapping,
            num_decodes=num_decodes,
            num_actual_tokens=m.num_actual_tokens,
            max_seq_len=m.max_seq_len,
            block_size=self.block_size,
        )
        return PortableAttentionMetadata(
            num_actual_tokens=m.num_actual_tokens,
            max_query_len=m.max_query_len,
            max_seq_len=m.max_seq_len,
            query_start_loc=m.query_start_loc,
            seq_lens=m.seq_lens,
            block_table=m.block_table_tensor,
            slot_mapping=m.slot_mapping,
            plan=plan,
        )


class PortableAttentionBackend(AttentionBackend):
    accept_output_buffer: bool = True
    forward_includes_kv_cache_update: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [
        torch.float16,
        torch.bfloat16,
        torch.float32,
    ]
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = ["auto"]

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls() -> type[PortableAttentionImpl]:
        return PortableAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[PortableAttentionMetadataBuilder]:
        return PortableAttentionMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    @staticmethod
    def use_cascade_attention(*args: Any, **kwargs: Any) -> bool:
        return False

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER


def _unsupported(what: str, fix: str) -> NotImplementedError:
    return NotImplementedError(f"{DISPLAY_NAME} does not support {what}. {fix}")


class PortableAttentionImpl(AttentionImpl[PortableAttentionMetadata]):
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
        scope = "It handles decoder-only causal attention with GQA."
        if attn_type != AttentionType.DECODER:
            kind = getattr(attn_type, "value", attn_type)
            raise _unsupported(f"{kind} attention", scope)
        if sliding_window is not None:
            raise _unsupported(
                f"sliding-window attention (window {sliding_window})",
                "Serve a model without sliding windows or pick another backend.",
            )
        if alibi_slopes is not None:
            raise _unsupported("ALiBi", "Serve a RoPE model or pick another backend.")
        if sinks is not None:
            raise _unsupported("attention sinks", "Pick another backend.")
        if kv_cache_dtype != "auto":
            raise _unsupported(
                f"kv_cache_dtype={kv_cache_dtype!r}", "Use --kv-cache-dtype auto."
            )
        unknown = sorted(k for k, v in extra.items() if v not in (None, False))
        if unknown:
            raise _unsupported(f"the attention options {unknown}", scope)
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
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        logger.info_once("vllm-kunlun: attention served by %s", DISPLAY_NAME)

    def forward(
        self,
        layer: AttentionLayer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: PortableAttentionMetadata,
        output: torch.Tensor | None = None,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output is None:
            raise ValueError(f"{DISPLAY_NAME} needs the output buffer from vLLM")
        if output_scale is not None or output_block_scale is not None:
            raise _unsupported(
                "fused output quantization", "Disable the attention fusion pass."
            )
        if attn_metadata is None:
            # vLLM's warm-up / profiling run: no KV cache bound yet.
            return output.fill_(0)
        plan = attn_metadata.plan
        if self.kv_sharing_target_layer_name is None and key is not None:
            paged.write_kv_cache(key, value, kv_cache, plan.slot_mapping)
        return paged.paged_attention(
            query, kv_cache, plan, output, self.scale, self.logits_soft_cap
        )
