"""vLLM attention backend over ``paged_portable.py``: portable paged attention in plain torch.

Why: host emulation has no usable attention backend (vLLM's CPU_ATTN needs ``vllm._C``),
and a CUDA-compatible device without vendor kernels needs one that runs anywhere. This
backend covers decoder-only causal attention with GQA, chunked prefill and prefix
caching, per-layer sliding windows (with vLLM's sliding-window KV manager), logit
soft-capping and attention sinks, and encoder-only attention of pooling models
(bidirectional, no KV cache: ``encoder_portable.py``); anything else is refused
when the layer is built, with the reason.

vLLM knows out-of-tree backends only as ``AttentionBackendEnum.CUSTOM``; the layer maps
``get_name()`` back to the enum, so the name is ``CUSTOM`` (see ``__init__.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionMetadata,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

from vllm_kunlun.logger import init_logger
from vllm_kunlun.ops.attention import encoder_portable as encoder
from vllm_kunlun.ops.attention import paged_portable as paged
from vllm_kunlun.ops.attention.common import (
    DecodesFirstMetadataBuilder,
    PluginAttentionBackend,
    PluginAttentionImpl,
)

logger = init_logger(__name__)

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
    plan: paged.AttentionPlan | encoder.EncoderPlan


class PortableAttentionMetadataBuilder(
    DecodesFirstMetadataBuilder[PortableAttentionMetadata]
):
    """Decodes first: they form one cheap group with a single query row each."""

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> PortableAttentionMetadata:
        m = common_attn_metadata
        plan: paged.AttentionPlan | encoder.EncoderPlan
        if not m.causal:  # encoder-only layers, no KV cache (encoder_portable.py)
            plan = encoder.plan_encoder(
                m.query_start_loc[: m.num_reqs + 1],
                m.max_query_len,
                m.num_actual_tokens,
            )
        else:
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


class PortableAttentionImpl(PluginAttentionImpl[PortableAttentionMetadata]):
    DISPLAY_NAME = DISPLAY_NAME
    ATTN_TYPES = (AttentionType.DECODER, AttentionType.ENCODER_ONLY)
    WHY: ClassVar[dict[str, str]] = {
        "attn_type": "It handles decoder and encoder-only attention with GQA.",
        "alibi": "Serve a RoPE model or pick another backend.",
        "kv_cache_dtype": "Use --kv-cache-dtype auto.",
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        logger.info_once("vllm-kunlun: attention served by %s", DISPLAY_NAME)

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: PortableAttentionMetadata,
        output: torch.Tensor,
    ) -> torch.Tensor:
        plan = attn_metadata.plan
        if isinstance(plan, encoder.EncoderPlan):  # no KV cache
            return encoder.encoder_attention(
                query, key, value, plan, output, self.scale, self.logits_soft_cap
            )
        if self.kv_sharing_target_layer_name is None and key is not None:
            paged.write_kv_cache(key, value, kv_cache, plan.slot_mapping)
        return paged.attend(  # the cache: [blocks, 2 (key, value), block, heads, dim]
            query,
            kv_cache[:, 0],
            kv_cache[:, 1],
            plan,
            output,
            self.scale,
            self.logits_soft_cap,
            window=self.sliding_window,
            sinks=self.sinks,
        )


class PortableAttentionBackend(PluginAttentionBackend):
    ATTN_TYPES = PortableAttentionImpl.ATTN_TYPES
    IMPL = PortableAttentionImpl
    BUILDER = PortableAttentionMetadataBuilder
    KV_CACHE_LAYOUT = ("num_blocks", 2, "block_size", "num_kv_heads", "head_size")

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int | MultipleOf]:
        # Pages are indexed by slot arithmetic (paged_portable.py): every block size works, so
        # a hybrid's page is the kernel block, never split.
        return [MultipleOf(1)]
