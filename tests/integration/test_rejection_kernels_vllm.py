"""vLLM 0.15.1's rejection sampler end to end on the CPU, with its three Triton kernels
replaced by ``kunlun_rejection_kernels`` (vllm_kunlun/ops/sampling/sampler_patches.py).

The calls are vLLM's own ``rejection_sample`` and ``expand_batch_to_tokens``; the
expected rows follow from the rule they implement (speculative sampling: keep a draft
while it matches the greedy target / passes ``p_target / p_draft >= u``, then the
target's token ends the row; the bonus token when every draft was kept).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from vllm.platforms import current_platform  # noqa: F401  (resolves the platform)
from vllm.v1.sample import rejection_sampler as rs
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata

from vllm_kunlun.ops.sampling import sampler_patches
from vllm_kunlun.patching.phases import Phase

P = rs.PLACEHOLDER_TOKEN_ID


@pytest.fixture(scope="module", autouse=True)
def installed() -> Iterator[None]:
    before = set(sampler_patches.applied())
    for name in ("kunlun_recovered_token_noise", sampler_patches.REJECTION_KERNELS):
        sampler_patches.RUNTIME_PATCHES[name](Phase.MODEL_PROCESS)
    yield
    if sampler_patches.REJECTION_KERNELS not in before:
        for patch in sampler_patches.KERNEL_PATCHES:
            patch.revert()
    for patch in sampler_patches.PATCHES:
        if patch.name not in before:
            patch.revert()


@pytest.fixture(autouse=True)
def no_exponential(monkeypatch: pytest.MonkeyPatch) -> None:
    def guard(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Tensor.exponential_ called on a sampling path")

    monkeypatch.setattr(torch.Tensor, "exponential_", guard)


def _metadata(temperature: list[float], generators: Any = None) -> SamplingMetadata:
    t = torch.tensor(temperature)
    greedy = all(x == 0 for x in temperature)
    return SamplingMetadata(
        temperature=t,
        all_greedy=greedy,
        all_random=all(x > 0 for x in temperature),
        top_p=None,
        top_k=None,
        generators=generators or {},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(len(t)),
        presence_penalties=torch.zeros(len(t)),
        repetition_penalties=torch.ones(len(t)),
        output_token_ids=[[] for _ in t],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def _one_hot(ids: list[int], vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(ids), vocab).float()


def test_greedy_rows_keep_matching_drafts_then_the_target_token() -> None:
    # Three requests with 3, 1 and 2 drafts; targets' argmax per draft position.
    drafts = [5, 6, 7, 2, 9, 9]
    target = [5, 6, 1, 2, 3, 9]  # req 0 diverges at pos 2, req 1 keeps, req 2 diverges
    out = rs.rejection_sample(
        torch.tensor(drafts, dtype=torch.int32),
        [3, 1, 2],
        3,
        torch.tensor([3, 4, 6], dtype=torch.int32),
        None,
        _one_hot(target, 16),
        torch.tensor([[11], [12], [13]], dtype=torch.int32),
        _metadata([0.0, 0.0, 0.0]),
    )
    assert out.tolist() == [[5, 6, 1, P], [2, 12, P, P], [3, P, P, P]]


def test_random_rows_accept_by_probability_ratio_and_end_on_a_rejection() -> None:
    vocab = 8
    # Request 0 (random): target puts all mass on each draft -> every draft kept +
    # bonus. Request 1 (random): target gives its draft no mass -> rejected at once,
    # the recovered token comes from the target (all its mass on token 4).
    # Request 2 (greedy): target argmax 3 differs from the draft -> 3 ends the row.
    drafts = [1, 2, 6, 0]
    target = _one_hot([1, 2, 4, 3], vocab)
    out = rs.rejection_sample(
        torch.tensor(drafts, dtype=torch.int32),
        [2, 1, 1],
        2,
        torch.tensor([2, 3, 4], dtype=torch.int32),
        None,
        target,
        torch.tensor([[7], [7], [7]], dtype=torch.int32),
        _metadata([1.0, 1.0, 0.0]),
    )
    assert out.tolist() == [[1, 2, 7], [4, P, P], [3, P, P]]


def test_expand_repeats_each_requests_value_over_its_tokens() -> None:
    out = rs.expand_batch_to_tokens(
        torch.tensor([4, -1, 6]),
        torch.tensor([2, 5, 6]),
        6,
        replace_from=-1,
        replace_to=0,
    )
    assert out.tolist() == [4, 4, 0, 0, 0, 6]


# Soft distributions over 8 tokens: the draft over-proposes some tokens (p < q) and
# under-proposes others (p > q), so both branches of the rule matter.
TARGET = torch.tensor(
    [[0.30, 0.05, 0.20, 0.05, 0.10, 0.10, 0.15, 0.05],
     [0.05, 0.40, 0.05, 0.10, 0.05, 0.05, 0.05, 0.25]]
)  # fmt: skip
DRAFT = torch.tensor(
    [[0.10, 0.30, 0.10, 0.20, 0.10, 0.10, 0.05, 0.05],
     [0.25, 0.10, 0.25, 0.10, 0.10, 0.10, 0.05, 0.05]]
)  # fmt: skip
ROWS = 20000


def _speculate(
    seed: int, with_draft_probs: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """ROWS requests of two drafts each, drawn from DRAFT, through vLLM's
    ``rejection_sample``: (drafts [ROWS, 2], output rows [ROWS, 3]). Without draft
    probabilities the call is the one vLLM 0.15.1 makes for MTP / EAGLE drafts
    (``draft_probs=None``: the draft counts as a point mass)."""
    gen = torch.Generator().manual_seed(seed)
    drafts = torch.stack(
        [torch.multinomial(DRAFT[pos], ROWS, True, generator=gen) for pos in (0, 1)], 1
    )
    torch.manual_seed(seed)  # the kernels' uniform draws and recovered-token noise
    out = rs.rejection_sample(
        drafts.flatten().to(torch.int32).contiguous(),
        [2] * ROWS,
        2,
        torch.arange(2, 2 * ROWS + 1, 2, dtype=torch.int32),
        DRAFT.repeat(ROWS, 1) if with_draft_probs else None,
        TARGET.repeat(ROWS, 1),
        torch.full((ROWS, 1), 7, dtype=torch.int32),
        _metadata([1.0] * ROWS),
    )
    return drafts, out


def _tv(counts: torch.Tensor, want: torch.Tensor) -> float:
    """Total-variation distance between the empirical frequencies and ``want``."""
    freq = counts[: len(want)].float() / counts.sum()
    return 0.5 * (freq - want).abs().sum().item()


def _tv_bound(want: torch.Tensor, n: int) -> float:
    """Three times the TV distance an exact sampler is expected to show with ``n``
    samples (each cell's mean absolute error is ``sqrt(2 p (1 - p) / (pi n))``); the
    spread around that mean is a fraction of it. With these tables that is 0.02 at
    n = 20,000 and 0.06 at n = 2,000, while a rule that ignores the uniform draw is
    off by >= 0.35 (it emits the draft's distribution)."""
    cells = (2 * want * (1 - want) / (torch.pi * n)).sqrt()
    return 3 * 0.5 * cells.sum().item()


# Acceptance rates: each token is proposed >= ~1,000 times, so a rate's standard error
# is <= 0.016 and the bound 0.05 is three of them.
def test_random_acceptance_follows_the_probability_ratio_statistically() -> None:
    """Speculative sampling's rule, as vLLM's own rejection-sampler tests check it:
    a draft token d at a position is kept with probability min(1, p(d) / q(d)). A rule
    that ignores the uniform draw (keeps every draft the target gives any mass) keeps
    every draft here, and fails."""
    drafts, out = _speculate(seed=1234)
    kept0 = out[:, 0] == drafts[:, 0]
    for token in range(8):
        proposed = drafts[:, 0] == token
        rate = kept0[proposed].float().mean().item()
        want = min(1.0, (TARGET[0, token] / DRAFT[0, token]).item())
        assert abs(rate - want) < 0.05, (token, rate, want)
    # Rows that rejected at position 0 end there.
    assert (out[~kept0, 1] == P).all()


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["q", "no_q"])
def test_emitted_tokens_follow_the_target_distribution(with_draft_probs: bool) -> None:
    """Whatever the draft, the token emitted at each position is distributed as the
    target (the point of speculative sampling). Checked apart from the acceptance
    rates: a kernel that keeps drafts too often emits the draft's distribution."""
    drafts, out = _speculate(seed=4321, with_draft_probs=with_draft_probs)
    emitted0 = torch.bincount(out[:, 0], minlength=8)
    assert _tv(emitted0, TARGET[0]) < _tv_bound(TARGET[0], ROWS), emitted0
    # Position 1 is judged only where position 0's draft was kept; its emitted token
    # is then distributed as the second target row.
    kept0 = out[:, 0] == drafts[:, 0]
    emitted1 = torch.bincount(out[kept0, 1], minlength=8)
    n1 = int(kept0.sum())  # ~ROWS * sum(min(p, q)) or ROWS * sum(q p) drafts kept
    assert n1 > 1500, n1
    assert _tv(emitted1, TARGET[1]) < _tv_bound(TARGET[1], n1), emitted1


def test_point_mass_drafts_are_kept_with_the_target_probability() -> None:
    """Without draft probabilities (MTP, EAGLE) a draft d is kept with probability
    p(d): the uniform draw decides, not whether p(d) is nonzero."""
    drafts, out = _speculate(seed=99, with_draft_probs=False)
    kept0 = out[:, 0] == drafts[:, 0]
    for token in range(8):
        proposed = drafts[:, 0] == token
        rate = kept0[proposed].float().mean().item()
        want = TARGET[0, token].item()
        assert abs(rate - want) < 0.05, (token, rate, want)
