"""Spec-decode draft sampling without ``Tensor.exponential_``.

Why: ``vllm.v1.spec_decode.eagle.compute_probs_and_sample_next_token`` draws a
batch x vocab ``exponential_`` tensor (CPU-only on Kunlun). vLLM 0.15.1 does not call it
yet (drafts are argmax), but it is the documented next step there.
How: the same function, with one uniform per row and inverse-transform sampling over
the draft probabilities (``ops.sampling_portable``), which needs no noise tensor; like
upstream it ignores per-request seeds for drafts. TP rank 0's draft tokens are
broadcast. Removable when vLLM stops using ``exponential_`` there.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_kunlun.ops import sampling_portable as portable
from vllm_kunlun.sample.tp import broadcast_from_first_rank

_SAMPLING_EPS = 1e-5  # vllm.v1.sample.sampler._SAMPLING_EPS


def compute_probs_and_sample_next_token(
    logits: torch.Tensor, sampling_metadata: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for vLLM's: (next token ids, draft probabilities)."""
    if sampling_metadata.all_greedy:
        return logits.argmax(dim=-1), logits
    temperature = sampling_metadata.temperature
    assert temperature is not None
    is_greedy = temperature < _SAMPLING_EPS
    if not sampling_metadata.all_random:
        temperature = torch.where(is_greedy, 1.0, temperature)
    logits.div_(temperature.view(-1, 1))
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    # The draft probs are returned for rejection sampling: sample without touching them.
    uniforms = torch.rand(probs.shape[0], device=probs.device)
    next_token_ids = portable.sample(
        probs, None, None, uniforms, scores_are_logits=False
    )
    if not sampling_metadata.all_random:
        next_token_ids = torch.where(is_greedy, probs.argmax(dim=-1), next_token_ids)
    return broadcast_from_first_rank(next_token_ids), probs
