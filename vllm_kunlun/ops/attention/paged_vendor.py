"""Paged attention on the vendor kernels: the KV-cache write, decode and prefill calls.

Why: the Kunlun attention backend (``vllm_kunlun/ops/attention/kunlun.py``) is vLLM's
paged-attention contract; this module is the only place that knows how the vendor
library is called for it. Call forms and keyword names are upstream's (facts in
``docs/vendor-calls.md``).

Assumptions, each from how upstream uses the kernels:
- The KV cache of a layer is two BHLD tensors, ``[num_blocks, num_kv_heads,
  block_size, head_size]`` (``reshape_and_cache_flash(..., BLHD_LAYOUT=False)``), both
  contiguous; token ``i`` of a request lives in block ``block_table[i // block_size]``
  at offset ``i % block_size``. Negative slots (vLLM's padding) are not written.
- Scores are scaled by ``1 / sqrt(head_size)``: no call form takes a scale, so the
  backend refuses layers with another one.
- GQA comes from the shapes: query head ``h`` reads KV head ``h // (heads / kv_heads)``.
- ``paged_attention`` attends one query per request over its first ``context_lens``
  cached tokens (the new token included: it is written first).
- ``prefill_attention`` is causal. Without ``is_prefix_cache`` it attends within the new
  tokens (``k``/``v`` are the new keys and values, ``[tokens, kv_heads, head_size]``);
  with it, ``k``/``v`` are the caches and request ``r``'s queries are the last
  ``q_len[r]`` of its ``kv_len[r]`` cached tokens (chunked prefill, prefix-cache hits).
- Lengths come as int32 "lod" offsets ``[0, l0, l0 + l1, ...]`` twice, on the host
  (``*_cpu``, the kernel plans with them) and on the device (``*_xpu``); block tables
  are int32 and slot mappings int64, as vLLM builds them.

Removal: never; this is the vendor seam for attention.
"""

from __future__ import annotations

import torch

from vllm_kunlun.ops.routes import Kernels

ATTENTION_KERNELS = ("reshape_and_cache_flash", "paged_attention", "prefill_attention")


def write_kv_cache(
    k: Kernels,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store new keys/values ([tokens, kv_heads, head_size]) at their slots."""
    k["reshape_and_cache_flash"](
        key.contiguous(),
        value.contiguous(),
        key_cache,
        value_cache,
        slot_mapping,
        BLHD_LAYOUT=False,
    )


def decode(
    k: Kernels,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """One new token per request ([requests, heads, head_size]) over the paged cache."""
    k["paged_attention"](
        x=query,
        k_cache=key_cache,
        v_cache=value_cache,
        block_tables=block_table,
        context_lens_cpu=seq_lens_cpu,
        context_lens_xpu=seq_lens,
        is_context=False,
        is_causal=True,
        out=out,
        vo_head_dim=query.shape[-1],
    )


def prefill_new_tokens(
    k: Kernels,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    q_lod: torch.Tensor,
    q_lod_cpu: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Prefills with no cached context: causal attention within the new tokens."""
    k["prefill_attention"](
        q=query,
        k=key.contiguous(),
        v=value.contiguous(),
        out=out,
        is_causal=True,
        context_qlen_lod_cpu=q_lod_cpu,
        context_qlen_lod_xpu=q_lod,
    )


def prefill_paged(
    k: Kernels,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    q_lod: torch.Tensor,
    q_lod_cpu: torch.Tensor,
    kv_lod: torch.Tensor,
    kv_lod_cpu: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Prefill chunks over cached context (their own tokens already written)."""
    k["prefill_attention"](
        q=query,
        k=key_cache,
        v=value_cache,
        out=out,
        is_causal=True,
        is_prefix_cache=True,
        block_table=block_table,
        context_qlen_lod_cpu=q_lod_cpu,
        context_qlen_lod_xpu=q_lod,
        context_kvlen_lod_cpu=kv_lod_cpu,
        context_kvlen_lod_xpu=kv_lod,
    )
