"""Fake MLA kernels: the latent cache write and the absorbed decode.

Semantics implemented (observed usage pins the call forms, docs/vendor-calls.md; the
real kernels' semantics must be confirmed on hardware):

- ``concat_and_cache_mla(kv_c, k_pe, slot_mapping, kv_cache)``: for each token ``t``
  with ``slot_mapping[t] >= 0``, row ``slot`` of the cache flattened to
  ``[num_blocks * block_size, L + R]`` becomes ``[kv_c[t], k_pe[t]]``.
- ``fwd_kvcache_mla``: for request ``b`` and head ``h``, the scores of the packed query
  ``q_c[b, 0, h]`` (``L + R`` wide) against the rows ``kv_cache[indices[b, 0, j]]``,
  ``j < kv_lod[b]``, times ``softmax_scale``; ``out[b, 0, h]`` is the softmax-weighted
  sum of those rows' first ``L`` (= ``out``'s last dimension) columns, ``max_logits``
  the largest scaled score and ``p_sums`` the sum of ``exp(score - max)``.

Computed in float64 with plain loops, independently of the plugin's portable kernels,
so a test comparing the two compares two implementations. Inputs are checked like a
device kernel's (contiguity, dtypes, shapes, index ranges); every call is recorded.
"""

from __future__ import annotations

import torch

from kunlun_ops._kernel_common import FLOATS, check_tensor, fail, record

__all__ = ["concat_and_cache_mla", "fwd_kvcache_mla"]


def concat_and_cache_mla(kv_c, k_pe, slot_mapping, kv_cache):
    name = "concat_and_cache_mla"
    record(name, kv_c=kv_c, k_pe=k_pe, slot_mapping=slot_mapping, kv_cache=kv_cache)
    check_tensor(name, "kv_c", kv_c, dtypes=FLOATS, dim=2)
    check_tensor(name, "k_pe", k_pe, dtypes=(kv_c.dtype,), dim=2)
    check_tensor(name, "kv_cache", kv_cache, dtypes=(kv_c.dtype,), dim=3)
    check_tensor(name, "slot_mapping", slot_mapping, dim=1)
    tokens, latent = kv_c.shape
    if k_pe.shape[0] != tokens or slot_mapping.shape[0] != tokens:
        fail(
            name,
            f"{tokens} kv_c rows, {k_pe.shape[0]} k_pe, {slot_mapping.shape[0]} slots",
        )
    width = latent + k_pe.shape[1]
    if kv_cache.shape[-1] != width:
        fail(name, f"kv_cache rows are {kv_cache.shape[-1]} wide, kv_c + k_pe {width}")
    flat = kv_cache.view(-1, width)
    for t in range(tokens):
        slot = int(slot_mapping[t])
        if slot < 0:
            continue
        if slot >= flat.shape[0]:
            fail(name, f"slot {slot} past the cache's {flat.shape[0]} rows")
        flat[slot, :latent] = kv_c[t]
        flat[slot, latent:] = k_pe[t]


def fwd_kvcache_mla(
    q_c,
    kv_cache,
    indices,
    kv_lod_cpu,
    out,
    max_logits,
    p_sums,
    softmax_scale,
    max_seq_kv,
    q_r=None,
    pe_cache=None,
    use_xfa_boost=False,
    kv_lod_xpu=None,
):
    name = "fwd_kvcache_mla"
    record(
        name,
        q_c=q_c,
        kv_cache=kv_cache,
        indices=indices,
        kv_lod_cpu=kv_lod_cpu,
        softmax_scale=softmax_scale,
        max_seq_kv=max_seq_kv,
        kv_lod_xpu=kv_lod_xpu,
    )
    if q_r is not None or pe_cache is not None or use_xfa_boost:
        raise NotImplementedError(
            "fake kunlun_ops.fwd_kvcache_mla models the packed query only"
        )
    check_tensor(name, "q_c", q_c, dtypes=FLOATS, dim=4)
    check_tensor(name, "kv_cache", kv_cache, dtypes=(q_c.dtype,), dim=2)
    check_tensor(name, "indices", indices, dtypes=(torch.int32,), dim=3)
    check_tensor(name, "kv_lod_cpu", kv_lod_cpu, dtypes=(torch.int32,), dim=1)
    check_tensor(name, "out", out, dtypes=(q_c.dtype,), dim=4)
    for stat, t in (("max_logits", max_logits), ("p_sums", p_sums)):
        check_tensor(name, stat, t, dtypes=(torch.float32,), dim=3)
    if kv_lod_cpu.device.type != "cpu":
        fail(name, f"kv_lod_cpu must be on the host, got {kv_lod_cpu.device}")
    if kv_lod_xpu is not None and kv_lod_xpu.cpu().tolist() != kv_lod_cpu.tolist():
        fail(name, "kv_lod_cpu and kv_lod_xpu differ")
    batch, seq_q, heads, width = q_c.shape
    latent = out.shape[-1]
    if seq_q != 1 or out.shape != (batch, 1, heads, latent):
        fail(name, f"q_c {tuple(q_c.shape)}, out {tuple(out.shape)}")
    if kv_cache.shape[1] != width or latent >= width:
        fail(name, f"kv_cache rows {kv_cache.shape[1]} wide, q_c {width}, out {latent}")
    lens = kv_lod_cpu.tolist()
    if len(lens) != batch or indices.shape[:2] != (batch, 1):
        fail(
            name, f"{len(lens)} lengths, indices {tuple(indices.shape)}, batch {batch}"
        )
    if max(lens) > max_seq_kv or max(lens) > indices.shape[2]:
        fail(name, f"lengths {lens} past max_seq_kv={max_seq_kv} / indices")
    rows_total = kv_cache.shape[0]
    for b in range(batch):
        rows = indices[b, 0, : lens[b]].tolist()
        if any(not 0 <= r < rows_total for r in rows):
            fail(name, f"request {b}: an index outside the cache's {rows_total} rows")
        kv = kv_cache[rows].double()  # [S, L + R]
        for h in range(heads):
            scores = (kv @ q_c[b, 0, h].double()) * softmax_scale
            top = scores.max()
            weights = torch.exp(scores - top)
            total = weights.sum()
            out[b, 0, h] = ((weights / total) @ kv[:, :latent]).to(out.dtype)
            max_logits[b, 0, h] = float(top)
            p_sums[b, 0, h] = float(total)
