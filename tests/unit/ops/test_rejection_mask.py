"""Runtime patch ``rejection_allowed_token_ids``: vLLM 0.15.1's own
``RejectionSampler.apply_logits_processors`` with a batch whose ``allowed_token_ids``
mask is set and whose ``output_token_ids`` is empty (what the input batch builds for a
plain request): without the patch it raises (the engine core dies); with it each draft
position keeps exactly its request's allowed tokens, as vLLM's own path does when
``output_token_ids`` is filled."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.rejection_sampler import RejectionSampler
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from tests.conftest import patch_state
from vllm_kunlun.ops.sampling import rejection_mask

VOCAB = 32


@pytest.fixture
def patched() -> Iterator[None]:
    with patch_state(rejection_mask, on=True):
        yield


@pytest.fixture
def unpatched() -> Iterator[None]:
    with patch_state(rejection_mask, on=False):
        yield


def _metadata(
    allowed: list[list[int]], output_token_ids: list[list[int]]
) -> SamplingMetadata:
    n = len(allowed)
    mask = torch.ones(n + 2, VOCAB, dtype=torch.bool)  # vLLM: True = masked out
    for row, ids in enumerate(allowed):
        mask[row, ids] = False
    zeros = torch.zeros(n)
    return SamplingMetadata(
        temperature=None,
        all_greedy=True,
        all_random=False,
        top_p=None,
        top_k=None,
        generators={},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=zeros,
        presence_penalties=zeros,
        repetition_penalties=torch.ones(n),
        output_token_ids=output_token_ids,
        allowed_token_ids_mask=mask[:n],
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def _run(
    allowed: list[list[int]], drafts: list[list[int]], filled: bool
) -> torch.Tensor:
    spec = SpecDecodeMetadata.make_dummy(drafts, torch.device("cpu"))
    outputs = [[1, 2] for _ in drafts] if filled else []
    logits = torch.randn(
        sum(len(d) for d in drafts), VOCAB, generator=torch.Generator().manual_seed(0)
    )
    sampler = RejectionSampler(Sampler())
    return sampler.apply_logits_processors(logits, _metadata(allowed, outputs), spec)


ALLOWED = [[3, 7], [5], [0, 1, 2]]
DRAFTS = [[4, 4], [9], [8, 8, 8]]  # 2, 1 and 3 draft positions


@pytest.mark.usefixtures("unpatched")
def test_without_the_patch_vllm_fails_on_the_plain_request() -> None:
    with pytest.raises(RuntimeError, match="must match"):
        _run(ALLOWED[:1], DRAFTS[:1], filled=False)


@pytest.mark.usefixtures("patched")
@pytest.mark.parametrize(
    ("allowed", "drafts"),
    [(ALLOWED[:1], DRAFTS[:1]), (ALLOWED, DRAFTS), (ALLOWED[1:], DRAFTS[1:])],
    ids=["one_request", "three_requests", "uneven"],
)
def test_each_draft_position_keeps_its_requests_allowed_tokens(
    allowed: list[list[int]], drafts: list[list[int]]
) -> None:
    got = _run(allowed, drafts, filled=False)
    # The reference: vLLM's own path, taken when output_token_ids is filled.
    want = _run(allowed, drafts, filled=True)
    assert torch.equal(got, want)
    row = 0
    for ids, draft in zip(allowed, drafts, strict=True):
        for _ in draft:
            kept = torch.isfinite(got[row]).nonzero().flatten().tolist()
            assert kept == ids
            row += 1
