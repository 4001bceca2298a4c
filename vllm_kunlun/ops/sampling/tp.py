"""Tensor-parallel consistency of sampled tokens.

Why: every TP rank runs the sampler on identical logits, but the vendor RNG is not known
to produce the same stream on every rank, even after ``manual_seed``. Ranks that sample
different tokens feed different inputs to their next step (async scheduling, spec
decode) and the model silently diverges. Rank 0 of the TP group therefore samples for
everyone: its token ids are broadcast over the group's device communicator (one small
collective per step).

``VLLM_KUNLUN_TP_SAMPLE_BROADCAST``: 1 (default) = on, which only acts when the TP group
has more than one rank; 0 = off (each rank keeps its own draw).
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_kunlun import envs
from vllm_kunlun.logger import init_logger

logger = init_logger(__name__)


def tp_group() -> Any | None:
    """vLLM's TP GroupCoordinator when the broadcast applies, else None."""
    if not envs.VLLM_KUNLUN_TP_SAMPLE_BROADCAST:
        return None
    from vllm.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return None
    group = parallel_state.get_tp_group()
    if group.world_size <= 1:
        return None
    logger.info_once(
        "vllm-kunlun: TP rank 0 samples for its %d-rank TP group and broadcasts the "
        "token ids (VLLM_KUNLUN_TP_SAMPLE_BROADCAST=0 disables this)",
        group.world_size,
    )
    return group


def broadcast_from_first_rank(tokens: torch.Tensor) -> torch.Tensor:
    """Every TP rank returns TP rank 0's ``tokens`` (same shape and dtype on all)."""
    group = tp_group()
    if group is None:
        return tokens
    tokens = tokens.contiguous()
    group.broadcast(tokens, src=0)
    return tokens
