"""The MLA backend's per-step plan: which requests decode, which prefill, and where.

Why its own module: the backend (``backend.py``) builds this plan and the seam
(``seam.py``) reads it, while the backend calls the seam; kept in either of the two,
each would import the other. Both import it from here. Removal: with the MLA backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.v1.attention.backend import AttentionMetadata, CommonAttentionMetadata
from vllm.v1.attention.backends.utils import split_decodes_and_prefills


@dataclass
class MLADecode:
    """The decode requests (first in the batch, one token each)."""

    block_table: torch.Tensor
    seq_lens: torch.Tensor  # on the device
    seq_lens_cpu: list[int]


@dataclass
class MLAPrefill:
    """The prefill requests (after the decodes): where their rows start in the prefill
    part of the batch and how many tokens each already has in the cache."""

    block_table: torch.Tensor
    query_start_loc: list[int]  # relative to the first prefill token
    context_lens: list[int]


@dataclass
class PluginMLAMetadata(AttentionMetadata):
    num_actual_tokens: int
    slot_mapping: torch.Tensor
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    decode: MLADecode | None
    prefill: MLAPrefill | None


def build_metadata(
    m: CommonAttentionMetadata, decode_threshold: int = 1
) -> PluginMLAMetadata:
    """Plan one engine step: the decodes (first in the batch) and, per prefill, where
    its rows start and how many of its tokens the cache already holds."""
    num_decodes, num_prefills, num_decode_tokens, _ = split_decodes_and_prefills(
        m, decode_threshold=decode_threshold
    )
    reqs = m.num_reqs
    starts = m.query_start_loc_cpu[: reqs + 1].tolist()
    seq_lens = m.seq_lens[:reqs].cpu().tolist()
    table = m.block_table_tensor[:reqs]
    decode = None
    if num_decodes:
        decode = MLADecode(
            block_table=table[:num_decodes],
            seq_lens=m.seq_lens[:num_decodes],
            seq_lens_cpu=seq_lens[:num_decodes],
        )
    prefill = None
    if num_prefills:
        first = starts[num_decodes]
        prefill = MLAPrefill(
            block_table=table[num_decodes:],
            query_start_loc=[s - first for s in starts[num_decodes:]],
            context_lens=[
                seq_lens[i] - (starts[i + 1] - starts[i])
                for i in range(num_decodes, reqs)
            ],
        )
    return PluginMLAMetadata(
        num_actual_tokens=m.num_actual_tokens,
        slot_mapping=m.slot_mapping,
        num_decodes=num_decodes,
        num_decode_tokens=num_decode_tokens,
        num_prefills=num_prefills,
        decode=decode,
        prefill=prefill,
    )
