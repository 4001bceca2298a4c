"""The runtime patch ``kunlun_chunked_prefill_drafts``
(vllm_kunlun/platforms/chunked_prefill_drafts.py) on vLLM 0.15.1's own objects: the
drafts of a request still prefilling in chunks are dropped, the others kept."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from vllm_kunlun.platforms import chunked_prefill_drafts


def test_drafts_of_unfinished_prefills_are_dropped() -> None:
    from vllm.v1.outputs import DraftTokenIds

    drafts = DraftTokenIds(["a", "b", "c"], [[5, 6], [7, 8], [9, 1]])
    kept = chunked_prefill_drafts.without_prefill_drafts(
        drafts, np.array([False, True, False])
    )
    assert kept.req_ids == ["a", "b", "c"]
    assert kept.draft_token_ids == [[5, 6], [], [9, 1]]


def _runner(discarded: list[bool]) -> Any:
    """vLLM's own GPUModelRunner, unconstructed, holding one step's drafts as its
    ``_get_draft_token_ids_cpu`` reads them (a list: the synchronous path)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runner = object.__new__(GPUModelRunner)
    ids = ["a", "b", "c"][: len(discarded)]
    runner.num_spec_tokens = 2
    runner._draft_token_req_ids = ids
    runner._draft_token_ids = [[5, 6], [7, 8], [9, 1]][: len(discarded)]
    runner.input_batch = SimpleNamespace(req_ids=ids)
    runner.discard_request_mask = SimpleNamespace(np=np.array([*discarded, True]))
    return runner


@pytest.mark.parametrize(
    ("discarded", "kept"),
    [
        ([False, True, False], [[5, 6], [], [9, 1]]),
        ([True, True], [[], []]),
        ([False], [[5, 6]]),
    ],
)
def test_the_patched_runner_drops_the_drafts_of_discarded_requests(
    discarded: list[bool], kept: list[list[int]]
) -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    chunked_prefill_drafts.revert()
    original = GPUModelRunner.take_draft_token_ids
    everything = [[5, 6], [7, 8], [9, 1]][: len(discarded)]
    assert original(_runner(discarded)).draft_token_ids == everything
    try:
        assert chunked_prefill_drafts.DRAFTS_PATCH.mismatch() is None
        assert chunked_prefill_drafts.apply()
        assert not chunked_prefill_drafts.apply()  # idempotent
        assert chunked_prefill_drafts.applied() == [chunked_prefill_drafts.NAME]
        drafts = GPUModelRunner.take_draft_token_ids(_runner(discarded))
        assert drafts.req_ids == ["a", "b", "c"][: len(discarded)]
        assert drafts.draft_token_ids == kept
    finally:
        chunked_prefill_drafts.revert()
    assert GPUModelRunner.take_draft_token_ids is original
    assert chunked_prefill_drafts.applied() == []
