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
from vllm_kunlun.ops.sampling.tp import broadcast_from_first_rank


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


# ---- the rejection sampler's three Triton kernels, in torch ------------------------------
# vLLM 0.15.1's ``rejection_sample`` and ``expand_batch_to_tokens`` launch
# ``rejection_greedy_sample_kernel``, ``rejection_random_sample_kernel`` and
# ``expand_kernel`` as ``kernel[grid](...)``; with no Triton driver (host emulation,
# CI) or on CPU tensors the launch fails. Each function below takes the kernel's own
# arguments (tensors for its pointers) and does what one program per request does.


def _draft_ranges(cu_num_draft_tokens: torch.Tensor) -> list[tuple[int, int]]:
    ends = cu_num_draft_tokens.tolist()
    return [(0 if i == 0 else ends[i - 1], end) for i, end in enumerate(ends)]


def rejection_greedy_sample(
    output_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_argmax: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    is_greedy: torch.Tensor | None,
    max_spec_len: int,
) -> None:
    """Greedy requests: keep drafts while they equal the target's argmax; the first
    mismatch is replaced by the argmax and ends the row; all kept: the bonus token."""
    greedy = is_greedy.tolist() if is_greedy is not None else None
    drafts, argmax = draft_token_ids.tolist(), target_argmax.tolist()
    _write_rows(
        output_token_ids,
        cu_num_draft_tokens,
        bonus_token_ids,
        lambda req: greedy is not None and not greedy[req],
        lambda pos: (argmax[pos], drafts[pos] == argmax[pos]),
    )


def _write_rows(
    output_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    skip: Callable[[int], bool],
    step: Callable[[int], tuple[int, bool]],
) -> None:
    """The row both rules write: per draft position ``step(pos)`` gives the token to
    write and whether the draft was kept; the first rejection ends the row, a row kept
    whole ends with the bonus token. Requests where ``skip(req)`` are the other rule's."""
    bonus = bonus_token_ids.reshape(-1).tolist()
    for req, (start, end) in enumerate(_draft_ranges(cu_num_draft_tokens)):
        if skip(req):
            continue
        row: list[int] = []
        for pos in range(start, end):
            token, kept = step(pos)
            row.append(token)
            if not kept:
                break
        else:
            row.append(bonus[req])
        output_token_ids[req, : len(row)] = torch.tensor(row, dtype=torch.int32)


def rejection_random_sample(
    output_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    recovered_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    is_greedy: torch.Tensor,
    max_spec_len: int,
    vocab_size: int,
    NO_DRAFT_PROBS: bool = False,
) -> None:
    """Random requests: accept draft ``d`` when ``p_target(d) / p_draft(d) >= u``
    (``p_draft`` = 1 without draft probabilities; a zero ``p_draft`` rejects); the first
    rejection takes the recovered token and ends the row; all kept: the bonus token."""
    greedy = is_greedy.tolist()
    drafts = draft_token_ids.tolist()
    rows = torch.arange(draft_token_ids.numel(), device=target_probs.device)
    ids = draft_token_ids.to(torch.long)
    target = target_probs[rows, ids].tolist()
    draft = (
        [1.0] * len(drafts)
        if NO_DRAFT_PROBS or draft_probs is None
        else draft_probs[rows, ids].tolist()
    )
    uniform, recovered = uniform_probs.tolist(), recovered_token_ids.tolist()

    def step(pos: int) -> tuple[int, bool]:
        if draft[pos] > 0 and target[pos] / draft[pos] >= uniform[pos]:
            return drafts[pos], True
        return recovered[pos], False

    _write_rows(
        output_token_ids,
        cu_num_draft_tokens,
        bonus_token_ids,
        lambda req: bool(greedy[req]),
        step,
    )


def expand(
    output: torch.Tensor,
    values: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from: int,
    replace_to: int,
    MAX_NUM_TOKENS: int = 0,
) -> None:
    """Repeat request ``i``'s value over its tokens (``replace_from`` -> ``replace_to``)."""
    counts = torch.diff(
        cu_num_tokens.to(torch.long), prepend=cu_num_tokens.new_zeros(1)
    )
    filled = torch.where(values == replace_from, replace_to, values)
    output.copy_(torch.repeat_interleave(filled, counts.to(values.device)))


class GridKernel:
    """Stands in for one Triton kernel: ``kernel[grid](*args)`` runs ``portable`` on
    CPU tensors or without a Triton driver, else the original kernel."""

    def __init__(self, original: Any, portable: Callable[..., None]) -> None:
        self.original = original
        self.portable = portable
        self.__wrapped__ = original

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            if _use_portable(args):
                self.portable(*args, **kwargs)
            else:
                self.original[grid](*args, **kwargs)

        return launch


def _use_portable(args: tuple[Any, ...]) -> bool:
    from vllm.triton_utils import HAS_TRITON

    first = next(a for a in args if isinstance(a, torch.Tensor))
    return first.device.type == "cpu" or not HAS_TRITON


PORTABLE_KERNELS: dict[str, Callable[..., None]] = {
    "rejection_greedy_sample_kernel": rejection_greedy_sample,
    "rejection_random_sample_kernel": rejection_random_sample,
    "expand_kernel": expand,
}
