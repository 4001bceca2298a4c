"""The runtime patch ``kunlun_chunked_prefill_drafts``: speculative drafts proposed for a
request still prefilling in chunks are dropped, on every model served with speculative
decoding.

Target: ``vllm.v1.worker.gpu_model_runner.GPUModelRunner.take_draft_token_ids`` (the CPU
and emulation runners inherit it).

Why: the drafter proposes tokens for every request of a step, also for one whose prefill
chunk was not its last (its sampled token is discarded); the scheduler then schedules the
rest of the prompt followed by those drafts. Those drafts came from a mid-prompt state
and predict prompt positions, not what follows the prompt.
  On every model (DeepSeek MTP too) they are verified after the prompt when they fit the
token budget, so a seeded request's generator is drawn a number of times that depends on
how its prompt was chunked (prefix-cache hits, the other requests): the same seed drew
other tokens in another batch (found by tests/integration/test_e2e_mla.py).
  On a hybrid (Gated DeltaNet) model the runner also sends such a request down the
prefill path (it is not decoding yet), whose GDN state absorbs the draft tokens whether
or not they are accepted and writes only the first of the request's speculative state
slots: the next steps decode from a wrong state (found by
tests/integration/test_e2e_mtp.py: greedy output diverged from transformers after a
chunked prefill with MTP).

How: drafts of requests whose sampled token was discarded this step (vLLM's
``discard_request_mask``) are dropped: the prompt finishes alone and drafting starts at
the first decode. Applied in every model process by the plugin's worker
(``Phase.MODEL_PROCESS``) and by the Qwen3.5 and Qwen3-Next models' constructors
(``Phase.HYBRID_MODEL``: a hybrid model served by another platform's worker), through
``patching.phases.apply_phase`` and ``RUNTIME_PATCHES``; idempotent, reverts, and a
mismatching upstream raises (``PatchMismatch`` names what differs).

Removal: when vLLM drafts only for requests that sampled a token.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from vllm_kunlun.patching.attribute import (
    AttributePatch,
    PatchGroups,
    expect_caller,
    expect_params,
)

GPU_RUNNER = "vllm.v1.worker.gpu_model_runner"


def _check_drafts(module: ModuleType, original: Any) -> str | None:
    return (
        expect_params(original, "GPUModelRunner.take_draft_token_ids", ("self",))
        or expect_caller(
            module, "GPUModelRunner._prepare_inputs", "discard_request_mask"
        )
        or expect_caller(
            module, "GPUModelRunner._get_draft_token_ids_cpu", "draft_token_ids_cpu"
        )
    )


def without_prefill_drafts(drafts: Any, discarded: Any) -> Any:
    """``drafts`` (vLLM's ``DraftTokenIds``) with no tokens for the requests whose
    sampled token was discarded (a prefill chunk that is not the last)."""
    from vllm.v1.outputs import DraftTokenIds

    rows = [
        [] if bool(discarded[i]) else list(ids)
        for i, ids in enumerate(drafts.draft_token_ids)
    ]
    return DraftTokenIds(list(drafts.req_ids), rows)


def _make_drafts(original: Any) -> Any:
    @functools.wraps(original)
    def take_draft_token_ids(self: Any) -> Any:
        drafts = original(self)
        if drafts is None:
            return drafts
        discarded = self.discard_request_mask.np[: len(drafts.req_ids)]
        return without_prefill_drafts(drafts, discarded)

    return take_draft_token_ids


NAME = "kunlun_chunked_prefill_drafts"
DRAFTS_PATCH = AttributePatch(
    NAME,
    GPU_RUNNER,
    "GPUModelRunner.take_draft_token_ids",
    _make_drafts,
    _check_drafts,
)

# A mismatching upstream raises: the drafts would make seeded sampling depend on
# chunking, and on a hybrid model corrupt the recurrent state.
GROUPS = PatchGroups({NAME: (DRAFTS_PATCH,)}, "speculative-decoding")
apply = functools.partial(GROUPS.apply, NAME)
revert = GROUPS.revert_all
applied = GROUPS.applied
RUNTIME_PATCHES = GROUPS.hooks()  # phases.apply_phase's hook (patching/phases.py)
