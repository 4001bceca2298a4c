"""Paged attention in plain torch: cache write by slot mapping, causal GQA over pages.

Why: a backend that runs on any torch device (the host CPU in emulation, a
CUDA-compatible card as an explicit choice) needs a reference implementation of vLLM's
paged KV cache semantics with no compiled kernels. It is also the oracle the tests use.

Layout (the same as vLLM's Triton backend, the default on Kunlun):
``kv_cache[num_blocks, 2, block_size, num_kv_heads, head_size]``; 0 keys, 1 values.
Token ``i`` of a request lives at slot ``block_table[r, i // block_size] * block_size +
i % block_size``.

Per-layer features (``attend``'s keywords): logit soft-capping (Gemma 2: ``cap *
tanh(s / cap)`` before the mask), a sliding window (query at position ``p`` sees keys
``p - window < j <= p``, as transformers' sliding masks and vLLM's sliding-window KV
manager count it) and attention sinks (gpt-oss: one learned logit per head that joins
the softmax denominator and carries no value). A windowed layer gathers only the keys
inside its window, from the first one the earliest query of each request can see, so
blocks the sliding-window KV manager has freed (beyond the window) are never read.
The two cache layouts of the plugin's backends are read alike: ``heads_first`` is the
Kunlun backend's BHLD page ``[blocks, kv_heads, block, dim]``.

A step's requests are split into groups (decodes, then prefills / chunked prefills, as
vLLM orders them); each group is padded to its longest query and longest context, so the
memory is ``requests x max_query x max_context`` per group. Index tensors are planned
once per step (``plan``) and reused by every layer; the per-layer work never moves data
to the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class KVView:
    """Which cache positions one group reads, and who may see them."""

    kv_block: torch.Tensor
    """[R, L] physical block of each gathered position (0 for padding)."""
    kv_offset: torch.Tensor
    """[R, L] offset inside the block."""
    mask: torch.Tensor
    """[R, Q, L] True where the query may attend to the key."""


@dataclass
class GroupPlan:
    """Index tensors for one padded group of requests (all on the compute device)."""

    q_index: torch.Tensor
    """[R, Q] token row of each (request, query position); padding: the dummy row."""
    kv_block: torch.Tensor
    """[R, L] physical block of each context position (0 for padding)."""
    kv_offset: torch.Tensor
    """[R, L] offset inside the block."""
    mask: torch.Tensor
    """[R, Q, L] True where the query may attend to the key (causal, in range)."""
    q_abs: torch.Tensor
    """[R, Q] position of each query in its sequence."""
    context_lens: torch.Tensor
    """[R] tokens cached before this step's first query."""
    seq_lens: torch.Tensor
    """[R] context + new tokens."""
    block_table: torch.Tensor
    """[R, max_blocks] the requests' block tables."""
    block_size: int
    max_query_len: int
    max_seq_len: int
    windows: dict[int, KVView] = field(default_factory=dict)
    """Per sliding window, the view its layers read; planned by the first such layer."""

    def view(self, window: int | None = None) -> KVView:
        """The positions a layer with ``window`` (None: full attention) reads."""
        if window is None or window >= self.max_seq_len:
            return KVView(self.kv_block, self.kv_offset, self.mask)
        found = self.windows.get(window)
        if found is None:
            found = self.windows[window] = _window_view(self, window)
        return found


def _window_view(group: GroupPlan, window: int) -> KVView:
    """Keys ``first[r] .. first[r] + L - 1`` of request ``r``, where ``first[r]`` is the
    first key its earliest query sees and ``L`` covers the last query's window."""
    device = group.seq_lens.device
    length = min(group.max_seq_len, group.max_query_len + window - 1)
    first = (group.context_lens - window + 1).clamp(min=0)  # [R]
    kv_pos = first[:, None] + torch.arange(length, device=device)[None, :]  # [R, L]
    block_col = (kv_pos // group.block_size).clamp(max=group.block_table.shape[1] - 1)
    kv_block = group.block_table.long().gather(1, block_col).clamp(min=0)
    kv_offset = kv_pos % group.block_size
    q = group.q_abs[:, :, None]
    k = kv_pos[:, None, :]
    mask = (k <= q) & (k > q - window) & (k < group.seq_lens.long()[:, None, None])
    return KVView(kv_block, kv_offset, mask)


@dataclass
class AttentionPlan:
    num_actual_tokens: int
    slot_mapping: torch.Tensor
    """[num_actual_tokens] cache slot of each new token (negative: do not write)."""
    groups: list[GroupPlan]


def plan_group(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    block_size: int,
    dummy_row: int,
) -> GroupPlan:
    """Index tensors for requests whose tokens are ``query_start_loc[r]:[r+1]``.

    ``query_start_loc`` ([R+1]), ``seq_lens`` ([R], context + new tokens) and
    ``block_table`` ([R, max_blocks]) are on the compute device; the two maxima are host
    integers (upper bounds are fine), so planning never synchronises with the device.
    """
    device = seq_lens.device
    starts = query_start_loc[:-1].long()
    query_lens = query_start_loc[1:].long() - starts
    context_lens = seq_lens.long() - query_lens

    q_pos = torch.arange(max_query_len, device=device)
    q_valid = q_pos[None, :] < query_lens[:, None]
    q_index = torch.where(q_valid, starts[:, None] + q_pos[None, :], dummy_row)

    kv_pos = torch.arange(max_seq_len, device=device)
    block_col = (kv_pos // block_size).clamp(max=block_table.shape[1] - 1)
    kv_block = block_table.long()[:, block_col].clamp(min=0)
    kv_offset = (kv_pos % block_size).expand_as(kv_block)

    abs_q_pos = context_lens[:, None] + q_pos[None, :]  # [R, Q]
    mask = (kv_pos[None, None, :] <= abs_q_pos[:, :, None]) & (
        kv_pos[None, None, :] < seq_lens.long()[:, None, None]
    )
    # Padded query rows may come out NaN (nothing to attend to); they only ever land
    # in the dummy row, which is dropped.
    return GroupPlan(
        q_index=q_index,
        kv_block=kv_block,
        kv_offset=kv_offset,
        mask=mask,
        q_abs=abs_q_pos,
        context_lens=context_lens,
        seq_lens=seq_lens.long(),
        block_table=block_table,
        block_size=block_size,
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
    )


def plan_step(
    query_start_loc: torch.Tensor,
    query_start_loc_cpu: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    num_decodes: int,
    num_actual_tokens: int,
    max_seq_len: int,
    block_size: int,
) -> AttentionPlan:
    """Plan one engine step: requests ``[:num_decodes]`` have one query token each
    (vLLM puts decodes first), the rest are prefills or prefill chunks.

    Only ``query_start_loc_cpu`` is read on the host, to size the prefill group.
    """
    num_reqs = seq_lens.shape[0]
    bounds = []  # (first request, end, max_query_len) of each group
    if num_decodes:
        bounds.append((0, num_decodes, 1))
    if num_reqs > num_decodes:
        lens = query_start_loc_cpu[num_decodes + 1 : num_reqs + 1]
        lens = lens - query_start_loc_cpu[num_decodes:num_reqs]
        bounds.append((num_decodes, num_reqs, max(int(lens.max()), 1)))
    groups = [
        plan_group(
            query_start_loc[lo : hi + 1],
            seq_lens[lo:hi],
            block_table[lo:hi],
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            block_size=block_size,
            dummy_row=num_actual_tokens,
        )
        for lo, hi, max_query_len in bounds
    ]
    return AttentionPlan(
        num_actual_tokens=num_actual_tokens,
        slot_mapping=slot_mapping[:num_actual_tokens],
        groups=groups,
    )


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store new keys/values ([T, num_kv_heads, head_size]) at their slots."""
    n = slot_mapping.shape[0]
    block_size = kv_cache.shape[2]
    slots = slot_mapping.long()
    valid = slots >= 0
    slots = slots[valid]
    blocks = slots // block_size
    offsets = slots % block_size
    kv_cache[blocks, 0, offsets] = key[:n][valid].to(kv_cache.dtype)
    kv_cache[blocks, 1, offsets] = value[:n][valid].to(kv_cache.dtype)


def attend(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    plan: AttentionPlan,
    output: torch.Tensor,
    scale: float,
    logits_soft_cap: float | None = None,
    *,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
    heads_first: bool = False,
) -> torch.Tensor:
    """Fill ``output[:num_actual_tokens]`` ([T, num_heads, head_size]) and return it.

    ``key_cache`` / ``value_cache`` are ``[blocks, block, kv_heads, dim]`` pages, or
    ``[blocks, kv_heads, block, dim]`` with ``heads_first``. Each group of the plan is
    computed in float32 as ``[R, Q, num_heads, head_size]`` and scattered to its rows.
    """
    n = plan.num_actual_tokens
    num_heads, head_size = query.shape[1], query.shape[2]
    num_kv_heads = key_cache.shape[1 if heads_first else 2]
    # One extra row: padded query positions read from and write to it.
    padded_q = torch.cat([query[:n], query.new_zeros(1, num_heads, head_size)])
    result = torch.zeros(
        n + 1, num_heads, head_size, dtype=output.dtype, device=output.device
    )
    for group in plan.groups:
        view = group.view(window)
        q = padded_q[group.q_index].float()  # [R, Q, H, D]
        r, nq_len = q.shape[0], q.shape[1]
        q = q.view(r, nq_len, num_kv_heads, num_heads // num_kv_heads, head_size)
        if heads_first:  # the sliced head axis lands after the indexed [R, L] axes
            k = key_cache[view.kv_block, :, view.kv_offset].float()  # [R, L, KH, D]
            v = value_cache[view.kv_block, :, view.kv_offset].float()
        else:
            k = key_cache[view.kv_block, view.kv_offset].float()
            v = value_cache[view.kv_block, view.kv_offset].float()
        scores = torch.einsum("rqkgd,rlkd->rkgql", q, k) * scale
        if logits_soft_cap:
            scores = logits_soft_cap * torch.tanh(scores / logits_soft_cap)
        scores = scores.masked_fill(~view.mask[:, None, None], float("-inf"))
        if sinks is None:
            probs = torch.softmax(scores, dim=-1)
        else:
            # The sink is one more logit per head in the denominator, with no value.
            sink = sinks.float().view(1, num_kv_heads, -1, 1, 1)
            sink = sink.expand(*scores.shape[:-1], 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        out = torch.einsum("rkgql,rlkd->rqkgd", probs, v)
        result.index_copy_(
            0,
            group.q_index.reshape(-1),
            out.reshape(-1, num_heads, head_size).to(result.dtype),
        )
    output[:n] = result[:n]
    return output
