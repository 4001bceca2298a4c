"""The MLA seam: Kunlun's MLA cache write and absorbed decode, or portable torch.

Why: the latent cache write and the decode are the per-step work of every MLA layer;
on Kunlun the vendor library has one call for each, elsewhere ``portable.py`` computes
the same thing. The prefill (multi-head over the up-projected context) runs portable on
every platform: no vendor call for it is pinned in docs/vendor-calls.md.

Vendor calls (declared in ``ops/contract.py``; forms in docs/vendor-calls.md, MLA
section):
- ``kunlun_ops.concat_and_cache_mla(kv_c, k_pe, slot_mapping, kv_cache)``, positional
  as upstream passes it: row ``slot`` of the flattened cache becomes ``[kv_c, k_pe]``.
- ``kunlun_ops.fwd_kvcache_mla`` by keyword: ``q_c`` ``[B, 1, H, L + R]`` (the absorbed
  query and its rope part packed), ``kv_cache`` the cache flattened to
  ``[slots, L + R]``, ``indices`` ``[B, 1, S]`` int32 (each request's slots in order),
  ``kv_lod_cpu`` / ``kv_lod_xpu`` the per-request lengths (not cumulative; positions
  past them are not read), ``max_seq_kv``, ``softmax_scale``, and the outputs ``out``
  ``[B, 1, H, L]``, ``max_logits`` / ``p_sums`` ``[B, 1, H]`` float32. The rope width
  is implied (``q_c``'s last dimension minus ``out``'s). Observed usage pins the
  keywords and shapes, not the semantics: the fake (``tests/fakes/kunlun_ops``)
  computes the softmax-normalised latent output, and hardware must confirm it.

No switch: ``ops/chooser.py`` takes the vendor kernels where the active platform
wants them and both load, else portable, logged once per device. Removal: with the
MLA backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_kunlun.ops import chooser, vendor
from vllm_kunlun.ops.mla import portable
from vllm_kunlun.ops.mla.metadata import MLADecode, PluginMLAMetadata

VENDOR = chooser.VENDOR
PORTABLE = chooser.PORTABLE
VENDOR_MODULE = "kunlun_ops"
CACHE_KERNEL = "concat_and_cache_mla"
DECODE_KERNEL = "fwd_kvcache_mla"


# (``concat_and_cache_mla``, ``fwd_kvcache_mla``) when the vendor path is chosen
MlaVendor = tuple[Callable[..., Any], Callable[..., Any]]
# The MLA path one device uses, why, and the vendor calls when chosen: the chooser's
# own choice, as it comes.
MlaKernels = chooser.Choice[MlaVendor]


def load_vendor() -> tuple[MlaVendor | None, str]:
    """(``concat_and_cache_mla``, ``fwd_kvcache_mla``), or None and why not."""
    found = []
    for name in (CACHE_KERNEL, DECODE_KERNEL):
        fn, why = vendor.function(VENDOR_MODULE, name)
        if fn is None:
            return None, why
        found.append(fn)
    return (found[0], found[1]), f"{VENDOR_MODULE} has {CACHE_KERNEL}, {DECODE_KERNEL}"


SEAM: chooser.DeviceSeam[MlaVendor, MlaKernels] = chooser.DeviceSeam(
    chooser.MLA, load_vendor, lambda c: c
)
select_kernels = SEAM.select  # the MLA path for tensors on a device, chosen once
reset = SEAM.reset
served = SEAM.served  # each path the MLA layers ran on here, with call counts


def write_cache(
    kernels: MlaKernels,
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    attn_metadata: PluginMLAMetadata,
) -> None:
    """Store this step's latent rows (``kv_c`` ``[T, L]``, ``k_pe`` ``[T, R]``)."""
    slots = attn_metadata.slot_mapping.flatten()[: kv_c.shape[0]]
    if kernels.vendor is not None:
        kernels.vendor[0](kv_c.contiguous(), k_pe.contiguous(), slots, kv_cache)
        return
    portable.write_latent_cache(kv_c, k_pe, kv_cache, slots)


def decode(
    kernels: MlaKernels,
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    decode_meta: MLADecode,
    kv_lora_rank: int,
    scale: float,
) -> torch.Tensor:
    """Absorbed decode: ``[B, H, L]`` latent output for one query token per request."""
    SEAM.record(q_latent.device, kernels.name, kernels.reason)
    if kernels.vendor is None:
        return portable.decode_attention(
            q_latent,
            q_pe,
            kv_cache,
            decode_meta.block_table,
            decode_meta.seq_lens,
            kv_lora_rank,
            scale,
        )
    batch, heads = q_latent.shape[:2]
    lens = decode_meta.seq_lens_cpu
    q_c = torch.cat([q_latent, q_pe.to(q_latent.dtype)], dim=-1).unsqueeze(1)
    out = q_latent.new_empty(batch, 1, heads, kv_lora_rank)
    stats = torch.empty(batch, 1, heads, dtype=torch.float32, device=q_latent.device)
    kernels.vendor[1](
        q_c=q_c.contiguous(),
        kv_cache=kv_cache.reshape(-1, kv_cache.shape[-1]),
        indices=slot_indices(decode_meta.block_table, lens, kv_cache.shape[1]),
        kv_lod_cpu=torch.tensor(lens, dtype=torch.int32),
        out=out,
        max_logits=stats,
        p_sums=torch.empty_like(stats),
        softmax_scale=scale,
        max_seq_kv=max(lens),
        kv_lod_xpu=decode_meta.seq_lens.to(torch.int32),
    )
    return out.squeeze(1)


def slot_indices(
    block_table: torch.Tensor, seq_lens: list[int], block_size: int
) -> torch.Tensor:
    """``[B, 1, max(seq_lens)]`` int32: each request's cache slots in order; -1 past
    its length (``fwd_kvcache_mla``'s ``indices``)."""
    longest = max(seq_lens)
    pos = torch.arange(longest, device=block_table.device)
    table = block_table[:, : (longest + block_size - 1) // block_size].to(torch.long)
    slots = table[:, pos // block_size] * block_size + pos % block_size
    lens = torch.tensor(seq_lens, device=block_table.device).unsqueeze(1)
    slots = torch.where(pos.unsqueeze(0) < lens, slots, torch.full_like(slots, -1))
    return slots.to(torch.int32).unsqueeze(1)
