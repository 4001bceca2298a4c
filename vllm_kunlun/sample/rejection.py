"""Rejection sampler (speculative decoding) without ``Tensor.exponential_``.

Why: vLLM 0.15.1's ``sample_recovered_tokens`` draws its Exp(1) noise with
``q.exponential_()`` (CPU-only on Kunlun, for a batch x vocab tensor every spec-decode
step), and its random choices differ between TP ranks when their RNGs differ.
How: the same algorithm with ``-log(U)`` noise from ``noise.exponential_noise`` (seeded
requests with draft tokens draw with their generator, as upstream); then vLLM's own
Triton kernel on a device, or its torch form on the CPU (Triton needs a GPU;
``ops/sampling/recovered_tokens.py``). ``rejection_sample`` is wrapped so that TP rank 0's output is broadcast.
Removable when vLLM draws this noise without ``exponential_``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_kunlun.ops.sampling.noise import exponential_noise
from vllm_kunlun.ops.sampling.recovered_tokens import recovered_tokens_reference
from vllm_kunlun.sample.tp import broadcast_from_first_rank


def sample_recovered_tokens(
    max_spec_len: int,
    num_draft_tokens: list[int],
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    sampling_metadata: Any,
    device: torch.device,
) -> torch.Tensor:
    """Drop-in for ``vllm.v1.sample.rejection_sampler.sample_recovered_tokens``."""
    batch = len(num_draft_tokens)
    vocab = target_probs.shape[-1]
    with_drafts = {i for i, n in enumerate(num_draft_tokens) if n > 0}
    q = exponential_noise(
        batch, vocab, sampling_metadata.generators, device, seeded_rows=with_drafts
    )
    if target_probs.device.type == "cpu":
        return recovered_tokens_reference(
            num_draft_tokens, draft_token_ids, draft_probs, target_probs, q
        )
    from vllm.triton_utils import triton
    from vllm.v1.sample import rejection_sampler as upstream

    recovered = torch.empty_like(draft_token_ids)
    upstream.sample_recovered_tokens_kernel[(batch, max_spec_len)](
        recovered,
        cu_num_draft_tokens,
        draft_token_ids,
        draft_probs,
        target_probs,
        q,
        vocab,
        triton.next_power_of_2(vocab),
        NO_DRAFT_PROBS=draft_probs is None,
    )
    return recovered


def broadcasting_rejection_sample(
    original: Callable[..., torch.Tensor],
) -> Callable[..., torch.Tensor]:
    """Wrap vLLM's ``rejection_sample`` so every TP rank returns rank 0's tokens."""

    def rejection_sample(*args: Any, **kwargs: Any) -> torch.Tensor:
        return broadcast_from_first_rank(original(*args, **kwargs))

    rejection_sample.__wrapped__ = original  # type: ignore[attr-defined]
    rejection_sample.__doc__ = original.__doc__
    return rejection_sample
