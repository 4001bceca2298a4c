"""Fake paged-attention kernels: the KV-cache write, decode and prefill.

Semantics as upstream uses them (see vllm_kunlun/ops/attention/paged_vendor.py): BHLD caches
``[num_blocks, kv_heads, block_size, head_size]``, scores scaled by 1/sqrt(head_size),
GQA from the shapes, causal masks aligned to the end of each sequence, int32 lengths
given as offsets on the host and on the device. Computed in float32 in plain torch.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kunlun_ops._kernel_common import (
    FLOATS,
    check_lod,
    check_same,
    check_tensor,
    fail,
    record,
    unmodeled,
)

__all__ = ["paged_attention", "prefill_attention", "reshape_and_cache_flash"]


def _check_caches(kernel: str, k_cache: Any, v_cache: Any) -> torch.Tensor:
    check_tensor(kernel, "k_cache", k_cache, dtypes=FLOATS, dim=4)
    check_tensor(
        kernel,
        "v_cache",
        v_cache,
        dtypes=(k_cache.dtype,),
        dim=4,
        device=k_cache.device,
    )
    if k_cache.shape[1:] != v_cache.shape[1:]:
        fail(
            kernel,
            f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ",
        )
    return k_cache


def _gather(cache: torch.Tensor, blocks: torch.Tensor, length: int) -> torch.Tensor:
    """A sequence's first ``length`` tokens: [length, kv_heads, head_size] float32."""
    block_size = cache.shape[2]
    needed = -(-length // block_size)
    pages = cache[blocks[:needed].long()]  # [needed, kv_heads, block, dim]
    return (
        pages.permute(0, 2, 1, 3)
        .reshape(-1, cache.shape[1], cache.shape[3])[:length]
        .float()
    )


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of the last ``len(q)`` positions of a ``len(k)`` sequence."""
    num_q, heads, dim = q.shape
    length, kv_heads = k.shape[0], k.shape[1]
    group = heads // kv_heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,lhd->hql", q.float(), k) / math.sqrt(dim)
    q_pos = torch.arange(length - num_q, length)[:, None]
    mask = torch.arange(length)[None, :] <= q_pos
    scores = scores.masked_fill(~mask[None].to(scores.device), float("-inf"))
    return torch.einsum("hql,lhd->qhd", scores.softmax(-1), v)


def reshape_and_cache_flash(
    key, value, key_cache, value_cache, slot_mapping, BLHD_LAYOUT=False
):
    name = "reshape_and_cache_flash"
    record(
        name,
        key=key,
        value=value,
        key_cache=key_cache,
        value_cache=value_cache,
        slot_mapping=slot_mapping,
        BLHD_LAYOUT=BLHD_LAYOUT,
    )
    unmodeled(name, BLHD_LAYOUT=(BLHD_LAYOUT, False))
    _check_caches(name, key_cache, value_cache)
    check_tensor(name, "key", key, dim=3)
    check_same(name, "key_cache", key_cache, key=key, value=value)
    check_tensor(
        name,
        "slot_mapping",
        slot_mapping,
        dtypes=(torch.int64, torch.int32),
        dim=1,
        device=key.device,
    )
    if key.shape != value.shape or key.shape[1:] != (
        key_cache.shape[1],
        key_cache.shape[3],
    ):
        fail(
            name,
            f"key {tuple(key.shape)} / value {tuple(value.shape)} do not fit cache {tuple(key_cache.shape)}",
        )
    if slot_mapping.shape[0] != key.shape[0]:
        fail(name, f"{slot_mapping.shape[0]} slots for {key.shape[0]} tokens")
    block_size = key_cache.shape[2]
    slots = slot_mapping.long()
    valid = slots >= 0
    if bool((slots[valid] >= key_cache.shape[0] * block_size).any()):
        fail(name, "slot beyond the cache")
    blocks, offsets = slots[valid] // block_size, slots[valid] % block_size
    key_cache[blocks, :, offsets] = key[valid]
    value_cache[blocks, :, offsets] = value[valid]


def paged_attention(
    *,
    x,
    k_cache,
    v_cache,
    block_tables,
    context_lens_cpu,
    context_lens_xpu,
    is_context,
    is_causal,
    out,
    vo_head_dim,
):
    name = "paged_attention"
    record(
        name,
        x=x,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        context_lens_cpu=context_lens_cpu,
        context_lens_xpu=context_lens_xpu,
        is_context=is_context,
        is_causal=is_causal,
        out=out,
        vo_head_dim=vo_head_dim,
    )
    unmodeled(name, is_context=(is_context, False), is_causal=(is_causal, True))
    _check_caches(name, k_cache, v_cache)
    check_tensor(name, "x", x, dim=3)
    check_same(name, "k_cache", k_cache, x=x, out=out)
    batch, heads, dim = x.shape
    if dim != k_cache.shape[3] or heads % k_cache.shape[1] or vo_head_dim != dim:
        fail(
            name,
            f"x {tuple(x.shape)}, vo_head_dim {vo_head_dim} do not fit cache {tuple(k_cache.shape)}",
        )
    if out.shape != x.shape:
        fail(name, f"out {tuple(out.shape)} for x {tuple(x.shape)}")
    check_tensor(
        name,
        "block_tables",
        block_tables,
        dtypes=(torch.int32,),
        dim=2,
        device=x.device,
    )
    check_tensor(
        name, "context_lens_cpu", context_lens_cpu, dtypes=(torch.int32,), dim=1
    )
    check_tensor(
        name,
        "context_lens_xpu",
        context_lens_xpu,
        dtypes=(torch.int32,),
        dim=1,
        device=x.device,
    )
    lens = context_lens_cpu.tolist()
    if context_lens_cpu.device.type != "cpu" or context_lens_xpu.cpu().tolist() != lens:
        fail(name, "context_lens_cpu must be the host copy of context_lens_xpu")
    if len(lens) != batch or block_tables.shape[0] != batch:
        fail(
            name,
            f"{batch} queries, {len(lens)} lengths, {block_tables.shape[0]} block tables",
        )
    for b, length in enumerate(lens):
        k = _gather(k_cache, block_tables[b], length)
        v = _gather(v_cache, block_tables[b], length)
        out[b] = _attend(x[b : b + 1], k, v)[0].to(out.dtype)


def prefill_attention(
    *,
    q,
    k,
    v,
    out,
    is_causal=True,
    is_prefix_cache=False,
    block_table=None,
    context_qlen_lod_cpu=None,
    context_qlen_lod_xpu=None,
    context_kvlen_lod_cpu=None,
    context_kvlen_lod_xpu=None,
    alibi_slopes=None,
    softmax_lse=None,
    swa_left=-1,
    swa_right=-1,
    sink=None,
):
    name = "prefill_attention"
    record(
        name,
        q=q,
        k=k,
        v=v,
        out=out,
        is_causal=is_causal,
        is_prefix_cache=is_prefix_cache,
        block_table=block_table,
        context_qlen_lod_cpu=context_qlen_lod_cpu,
        context_qlen_lod_xpu=context_qlen_lod_xpu,
        context_kvlen_lod_cpu=context_kvlen_lod_cpu,
        context_kvlen_lod_xpu=context_kvlen_lod_xpu,
    )
    unmodeled(
        name,
        is_causal=(is_causal, True),
        alibi_slopes=(alibi_slopes, None),
        softmax_lse=(softmax_lse, None),
        swa_left=(swa_left, -1),
        swa_right=(swa_right, -1),
        sink=(sink, None),
    )
    check_tensor(name, "q", q, dtypes=FLOATS, dim=3)
    check_same(name, "q", q, out=out)
    if out.shape != q.shape:
        fail(name, f"out {tuple(out.shape)} for q {tuple(q.shape)}")
    heads, dim = q.shape[1], q.shape[2]
    if context_qlen_lod_cpu is None or context_qlen_lod_xpu is None:
        fail(name, "context_qlen_lod_cpu/_xpu are required")
    num_reqs = context_qlen_lod_cpu.shape[0] - 1
    q_lod = check_lod(
        name,
        "context_qlen_lod",
        context_qlen_lod_cpu,
        context_qlen_lod_xpu,
        q.device,
        num_reqs + 1,
    )
    if q_lod[-1] != q.shape[0]:
        fail(name, f"context_qlen_lod ends at {q_lod[-1]} for {q.shape[0]} query rows")
    if is_prefix_cache:
        _check_caches(name, k, v)
        check_same(name, "q", q, k=k, v=v)
        check_tensor(
            name,
            "block_table",
            block_table,
            dtypes=(torch.int32,),
            dim=2,
            device=q.device,
        )
        if context_kvlen_lod_cpu is None or context_kvlen_lod_xpu is None:
            fail(name, "is_prefix_cache needs context_kvlen_lod_cpu/_xpu")
        kv_lod = check_lod(
            name,
            "context_kvlen_lod",
            context_kvlen_lod_cpu,
            context_kvlen_lod_xpu,
            q.device,
            num_reqs + 1,
        )
        if block_table.shape[0] != num_reqs:
            fail(name, f"{block_table.shape[0]} block tables for {num_reqs} requests")
    else:
        check_tensor(name, "k", k, dim=3)
        check_same(name, "q", q, k=k, v=v)
        if k.shape != v.shape or k.shape[0] != q.shape[0]:
            fail(
                name, f"k {tuple(k.shape)} / v {tuple(v.shape)} for q {tuple(q.shape)}"
            )
        unmodeled(
            name,
            block_table=(block_table, None),
            context_kvlen_lod_cpu=(context_kvlen_lod_cpu, None),
        )
        kv_lod = q_lod
    kv_heads = k.shape[1]
    if heads % kv_heads or k.shape[-1] != dim:
        fail(
            name,
            f"{heads} query heads of {dim} over {kv_heads} kv heads of {k.shape[-1]}",
        )
    for r in range(num_reqs):
        qs, qe = q_lod[r], q_lod[r + 1]
        length = kv_lod[r + 1] - kv_lod[r]
        if qe - qs > length:
            fail(name, f"request {r}: {qe - qs} queries over {length} keys")
        if is_prefix_cache:
            keys = _gather(k, block_table[r], length)
            values = _gather(v, block_table[r], length)
        else:
            keys, values = k[qs:qe].float(), v[qs:qe].float()
        out[qs:qe] = _attend(q[qs:qe], keys, values).to(out.dtype)
