"""The recovered tokens of speculative decoding's rejection sampler, in portable torch.

Why: vLLM 0.15.1 computes them with a Triton kernel (``sample_recovered_tokens_kernel``),
which needs a GPU; host emulation and CPU tests need the same computation without one.
vLLM's glue (the drop-in for ``sample_recovered_tokens``, the TP broadcast) is in
``sample/rejection.py``; this module is only the kernel.
"""

from __future__ import annotations

import torch


def recovered_tokens_reference(
    num_draft_tokens: list[int],
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    q: torch.Tensor,
) -> torch.Tensor:
    """Torch form of vLLM's ``sample_recovered_tokens_kernel`` (one row per token).

    The recovered distribution is ``max(target - draft, 0)`` (``target`` without the
    draft token when there are no draft probs); the token is ``argmax(prob / q)`` with
    the request's Exp(1) noise ``q``, i.e. a sample from that distribution.
    """
    batch = len(num_draft_tokens)
    counts = torch.tensor(num_draft_tokens, dtype=torch.int64, device=q.device)
    request = torch.repeat_interleave(
        torch.arange(batch, device=q.device), counts, output_size=sum(num_draft_tokens)
    )
    if draft_probs is None:
        prob = target_probs.clone()
        prob.scatter_(1, draft_token_ids.long().unsqueeze(1), 0.0)
    else:
        prob = (target_probs - draft_probs).clamp_(min=0.0)
    return prob.div_(q[request]).argmax(dim=-1).to(draft_token_ids.dtype)
