"""Multi-head latent attention in plain torch: any device, any block size.

Why: vLLM 0.15.1's MLA backends all need CUDA or ROCm binaries (FlashMLA, CUTLASS,
FlashInfer, FlashAttention for the prefill, ``vllm._C`` for the cache write and the
context gather), so neither host emulation nor a Kunlun device without the vendor MLA
kernels could serve a DeepSeek model.

The cache holds one latent row per token, ``kv_lora_rank + qk_rope_head_dim`` wide
(``[num_blocks, block_size, L + R]``, vLLM's ``MLACommonBackend`` shape): the
compressed KV ``kv_c`` (already normed) then the roped key part ``k_pe``. Slot ``s``
lives at block ``s // block_size``, row ``s % block_size``.

- Prefill (``prefill_attention``): per request, the cached context rows (prefix-cache
  hits, earlier chunks of a chunked prefill) are gathered and up-projected with
  ``kv_b_proj`` beside the new tokens' own, and the queries attend causally over
  ``context + new`` in full multi-head form (``qk_nope + rope`` wide keys, ``v_head``
  wide values).
- Decode (``decode_attention``): the absorbed form. The caller has already multiplied
  ``q_nope`` by ``W_UK`` (``q_latent``, ``L`` wide); every head attends over the latent
  rows directly (``q_latent . kv_c + q_pe . k_pe``) and returns the weighted sum of
  ``kv_c``, which the caller multiplies by ``W_UV``. Nothing per head is stored.

Scores and softmax run in float32 whatever the model dtype. Removal: when a vendor
path serves every MLA layer and no device runs without it.
"""

from __future__ import annotations

import torch


def write_latent_cache(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store each token's ``[kv_c, k_pe]`` row at its slot; slots < 0 (padding) are
    skipped. ``kv_c``: ``[T, L]``; ``k_pe``: ``[T, R]`` (or ``[T, 1, R]``)."""
    rows = torch.cat([kv_c, k_pe.flatten(1) if k_pe.dim() == 3 else k_pe], dim=-1)
    slots = slot_mapping[: rows.shape[0]].to(torch.long)
    keep = slots >= 0
    flat = kv_cache.view(-1, kv_cache.shape[-1])
    flat.index_copy_(0, slots[keep], rows[keep].to(kv_cache.dtype))


def gather_latent(
    kv_cache: torch.Tensor, block_table: torch.Tensor, start: int, end: int
) -> torch.Tensor:
    """One request's cached rows for positions ``[start, end)``: ``[end - start, L + R]``.
    ``block_table``: that request's row of the block table."""
    block_size = kv_cache.shape[1]
    pos = torch.arange(start, end, device=block_table.device)
    slots = (
        block_table[pos // block_size].to(torch.long) * block_size + pos % block_size
    )
    return kv_cache.view(-1, kv_cache.shape[-1])[slots.to(kv_cache.device)]


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: int, scale: float
) -> torch.Tensor:
    """Causal attention of ``q`` (``[n, H, Dk]``, positions ``context..context+n-1``)
    over ``k``/``v`` (``[context + n, H, D]``), float32 scores: ``[n, H, Dv]``."""
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    n, total = q.shape[0], k.shape[0]
    query_pos = torch.arange(n, device=q.device).unsqueeze(1) + context
    key_pos = torch.arange(total, device=q.device).unsqueeze(0)
    scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)


def prefill_attention(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    v: torch.Tensor,
    query_start_loc: list[int],
    context_lens: list[int],
    context_kv: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None],
    scale: float,
) -> torch.Tensor:
    """Prefill queries ``q`` (``[T, H, P + R]``) of several requests, ``query_start_loc``
    (``len = requests + 1``) splitting the rows. The new tokens' keys are ``k_nope``
    (``[T, H, P]``) with the shared ``k_pe`` (``[T, R]``), their values ``v``
    (``[T, H, V]``); ``context_kv[i]`` is request ``i``'s up-projected cached context
    ``(k_nope, k_pe, v)`` of ``context_lens[i]`` tokens (None when it has none).
    Returns ``[T, H, V]``."""
    heads = q.shape[1]
    out = q.new_empty(q.shape[0], heads, v.shape[-1])
    for i, context in enumerate(context_lens):
        lo, hi = query_start_loc[i], query_start_loc[i + 1]
        if hi == lo:
            continue
        kn, kp, vv = k_nope[lo:hi], k_pe[lo:hi], v[lo:hi]
        cached = context_kv[i]
        if cached is not None:
            kn = torch.cat([cached[0], kn])
            kp = torch.cat([cached[1], kp])
            vv = torch.cat([cached[2], vv])
        k = torch.cat([kn, kp.unsqueeze(1).expand(-1, heads, -1)], dim=-1)
        out[lo:hi] = _attend(q[lo:hi], k, vv, context, scale)
    return out


def decode_attention(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_lora_rank: int,
    scale: float,
) -> torch.Tensor:
    """Absorbed decode, one query token per request: ``q_latent`` ``[B, H, L]`` (q_nope
    times ``W_UK``), ``q_pe`` ``[B, H, R]``; each request attends over its
    ``seq_lens[b]`` cached latent rows. Returns the attention-weighted latent
    ``[B, H, L]`` (the caller applies ``W_UV``)."""
    batch = q_latent.shape[0]
    block_size = kv_cache.shape[1]
    lens = seq_lens[:batch].to(torch.long)
    longest = int(lens.max().item()) if batch else 0
    pos = torch.arange(longest, device=block_table.device)
    blocks = block_table[:batch, : (longest + block_size - 1) // block_size]
    slots = blocks[:, pos // block_size].to(torch.long) * block_size + pos % block_size
    valid = pos.unsqueeze(0) < lens.to(pos.device).unsqueeze(1)  # [B, S]
    slots = torch.where(valid, slots, torch.zeros_like(slots))
    rows = kv_cache.view(-1, kv_cache.shape[-1])[slots.to(kv_cache.device)].float()
    # Rows past a request's length are whatever the slot-0 row holds: zero them so that
    # a stale non-finite value cannot leak through the masked softmax (0 * nan).
    rows = rows.masked_fill(~valid.to(rows.device).unsqueeze(-1), 0.0)
    kv_c, k_pe = rows[..., :kv_lora_rank], rows[..., kv_lora_rank:]  # [B, S, *]
    scores = torch.einsum("bhl,bsl->bhs", q_latent.float(), kv_c)
    scores = (scores + torch.einsum("bhr,bsr->bhs", q_pe.float(), k_pe)) * scale
    scores = scores.masked_fill(~valid.to(scores.device).unsqueeze(1), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("bhs,bsl->bhl", probs, kv_c).to(q_latent.dtype)
