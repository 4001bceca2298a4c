"""vLLM MLA attention backend for the plugin's platforms (DeepSeek-V2/V3/R1, Kimi-K2).

Why: the platforms used to refuse every ``use_mla`` layer, since each MLA backend of
vLLM 0.15.1 needs CUDA / ROCm binaries. This backend plugs into vLLM's MLA machinery:
``MLAAttention`` (the layer, with its latent ``MLAAttentionSpec`` pages),
``MLACommonBackend`` (cache shape ``[num_blocks, block_size, kv_lora_rank +
qk_rope_head_dim]``) and ``MLACommonBaseImpl`` (``W_UK_T`` / ``W_UV`` split out of
``kv_b_proj`` after loading, and the ``W_UV`` up-projection of the decode output). What
vLLM's ``MLACommonImpl`` adds on top needs CUDA (FlashAttention prefill,
``vllm._C`` cache write and context gather, Triton merges), so the forward here is the
plugin's: the cache write and the absorbed decode through ``seam.py`` (vendor kernels
or portable torch), the prefill in portable torch (``portable.py``).

vLLM names an out-of-tree backend ``CUSTOM``; the platforms return this class's path
for ``use_mla`` layers (``select.py``). Removal: when vLLM ships an MLA backend that
runs without CUDA binaries, or a Kunlun MLA backend upstream serves 0.15.1.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonBackend,
    MLACommonBaseImpl,
)
from vllm.v1.attention.backend import (
    AttentionLayer,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)

from vllm_kunlun.logger import init_logger
from vllm_kunlun.ops.attention.common import (
    DecodesFirstMetadataBuilder,
    PluginBackendAnswers,
)
from vllm_kunlun.ops.mla import portable, seam
from vllm_kunlun.ops.mla.metadata import PluginMLAMetadata, build_metadata

logger = init_logger(__name__)

DISPLAY_NAME = "vllm-kunlun MLA attention"


class PluginMLAMetadataBuilder(DecodesFirstMetadataBuilder[PluginMLAMetadata]):
    """Decodes first (one query token each), then prefills; planned on the host every
    step (no CUDA graphs)."""

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> PluginMLAMetadata:
        return build_metadata(common_attn_metadata, self.reorder_batch_threshold or 1)


class PluginMLAImpl(MLACommonBaseImpl[PluginMLAMetadata]):
    """vLLM's MLA weight handling (``MLACommonBaseImpl``) with the plugin's forward."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None,
        attn_type: str,
        kv_sharing_target_layer_name: str | None,
        **mla_args: Any,
    ) -> None:
        refused = {
            "ALiBi": alibi_slopes,
            "sliding windows": sliding_window,
            "logit soft-capping": logits_soft_cap,
        }
        named = [what for what, value in refused.items() if value]
        if named:
            raise NotImplementedError(
                f"{DISPLAY_NAME} does not support {', '.join(named)}; DeepSeek-style "
                "MLA layers use none of them."
            )
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(
                f"{DISPLAY_NAME} serves decoder self-attention only, not {attn_type}."
            )
        if kv_cache_dtype != "auto":
            raise NotImplementedError(
                f"{DISPLAY_NAME} does not support kv_cache_dtype={kv_cache_dtype!r}: "
                "the latent cache is kept in the model dtype. Use --kv-cache-dtype "
                "auto."
            )
        if mla_args.get("indexer") is not None:
            raise NotImplementedError(
                f"{DISPLAY_NAME} has no sparse (DSA indexer) attention."
            )
        super().__init__(
            num_heads,
            head_size,
            scale,
            num_kv_heads,
            alibi_slopes,
            sliding_window,
            kv_cache_dtype,
            logits_soft_cap,
            attn_type,
            kv_sharing_target_layer_name,
            **mla_args,
        )
        logger.info_once("vllm-kunlun: MLA layers served by %s", DISPLAY_NAME)

    def forward(
        self,
        layer: AttentionLayer,
        q: torch.Tensor,
        k_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: PluginMLAMetadata,
        output: torch.Tensor | None = None,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """vLLM's call: ``q`` ``[T, H, P + R]`` (rope applied), ``k_c_normed``
        ``[T, L]``, ``k_pe`` ``[T, 1, R]``; writes ``[T, H * V]`` into ``output``."""
        if output is None:
            raise ValueError(f"{DISPLAY_NAME} needs the output buffer from vLLM")
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError(
                f"{DISPLAY_NAME} does not support fused output quantization; disable "
                "the attention fusion pass."
            )
        if attn_metadata is None:  # vLLM's warm-up run: no cache bound yet
            return output.fill_(0)
        n = attn_metadata.num_actual_tokens
        out = output[:n]
        q, k_c_normed, k_pe = q[:n], k_c_normed[:n], k_pe[:n].flatten(1)
        kernels = seam.select_kernels(q.device)
        if kv_cache.numel() > 0:
            seam.write_cache(kernels, k_c_normed, k_pe, kv_cache, attn_metadata)
        split = attn_metadata.num_decode_tokens
        if attn_metadata.prefill is not None:
            prefilled = self._prefill(
                q[split:], k_c_normed[split:], k_pe[split:], kv_cache, attn_metadata
            )
            out[split:] = prefilled.flatten(start_dim=-2).to(out.dtype)
        if attn_metadata.decode is not None:
            latent = self._decode(q[:split], kv_cache, attn_metadata, kernels)
            self._v_up_proj(latent, out=out[:split])
        return output

    def _up_project(self, kv_c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv_b_proj`` of latent rows: per-head ``(k_nope, v)``."""
        kv = self.kv_b_proj(kv_c)[0].view(
            -1, self.num_heads, self.qk_nope_head_dim + self.v_head_dim
        )
        k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        return k_nope, v

    def _prefill(
        self,
        q: torch.Tensor,
        kv_c: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: PluginMLAMetadata,
    ) -> torch.Tensor:
        prefill = attn_metadata.prefill
        assert prefill is not None
        context_kv: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None] = []
        for i, context in enumerate(prefill.context_lens):
            if context == 0:
                context_kv.append(None)
                continue
            rows = portable.gather_latent(kv_cache, prefill.block_table[i], 0, context)
            rows = rows.to(kv_c.dtype)
            c_nope, c_v = self._up_project(rows[:, : self.kv_lora_rank])
            context_kv.append((c_nope, rows[:, self.kv_lora_rank :], c_v))
        k_nope, v = self._up_project(kv_c)
        return portable.prefill_attention(
            q,
            k_nope,
            k_pe,
            v,
            prefill.query_start_loc,
            prefill.context_lens,
            context_kv,
            self.scale,
        )

    def _decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: PluginMLAMetadata,
        kernels: seam.MlaKernels,
    ) -> torch.Tensor:
        decode = attn_metadata.decode
        assert decode is not None
        q_nope, q_pe = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        # Absorb W_UK: (H, B, P) x (H, P, L) -> (B, H, L).
        q_latent = torch.bmm(q_nope.transpose(0, 1), self.W_UK_T).transpose(0, 1)
        return seam.decode(
            kernels,
            q_latent.contiguous(),
            q_pe.contiguous(),
            kv_cache,
            decode,
            self.kv_lora_rank,
            self.scale,
        )


class PluginMLABackend(PluginBackendAnswers, MLACommonBackend):
    """vLLM's MLA cache layout (``MLACommonBackend``) with the plugin's impl and
    builder; the class answers every plugin backend gives (``PluginBackendAnswers``)."""

    IMPL = PluginMLAImpl
    BUILDER = PluginMLAMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int | MultipleOf]:
        # Rows are found by slot arithmetic: every page size vLLM picks works as is.
        return [MultipleOf(1)]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []  # any kv_lora_rank + qk_rope_head_dim

    @classmethod
    def supports_block_size(cls, block_size: int | None) -> bool:
        return block_size is None or block_size > 0
