"""End to end in host emulation: Qwen3-Next through vLLM 0.15.1's own
``Qwen3NextForCausalLM`` (the plugin's subclass, models/qwen3_next.py) with its Gated
DeltaNet kernels on the plugin's GDN seam, greedy token for token equal to transformers
5.2.0's ``Qwen3NextForCausalLM`` on a tiny checkpoint that transformers itself wrote
(qwen3_next_checkpoint.py).

One engine per configuration (module-scoped), each with its reference in the same
interpreter: chunked prefill (32-token budget), a prefix-cache hit, 1-token prompts
(alone, and queued behind a long prefill on a recycled state slot), mixed
prefill/decode batches (test_e2e_hybrid.GREEDY_JOBS); portable kernels.
- ``dense``: every layer's MLP dense (``mlp_only_layers``), the GDN routing alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.qwen3_next_checkpoint import write_qwen3_next
from tests.integration.test_e2e_emulation import BLOCK_SIZE, TOKEN_BUDGET, run_spec
from tests.integration.test_e2e_hybrid import GREEDY_JOBS, GREEDY_TOKENS, LLM_ARGS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e_qwen3_next")


def _run(work: Path, layout: str) -> dict:
    model = write_qwen3_next(work / layout, layout)
    spec = {
        "backend": "vllm",
        "model": str(model),
        "llm": LLM_ARGS,
        "engine_in_process": True,
        "jobs": GREEDY_JOBS,
        "hf_jobs": GREEDY_JOBS,
        "hf_cache": True,
    }
    return run_spec(spec, work, layout, timeout=600)


@pytest.fixture(scope="module")
def dense(work: Path) -> dict:
    return _run(work, "dense")


def _rows(run: dict, job: str) -> list[dict[str, Any]]:
    return run["jobs"][job]


def _assert_greedy_matches(run: dict) -> None:
    hf = run["hf"]
    for job in GREEDY_JOBS:
        name = job["name"]
        for got, want in zip(_rows(run, name), hf[name], strict=True):
            assert got["prompt_token_ids"] == want["prompt_token_ids"]
            assert got["token_ids"] == want["token_ids"], (name, got["text"])
    for row in hf["greedy"]:  # the reference is not degenerate
        assert len(set(row["token_ids"])) >= GREEDY_TOKENS // 2, row


def _assert_paths_exercised(run: dict) -> None:
    greedy = _rows(run, "greedy")
    assert len(greedy[2]["prompt_token_ids"]) > TOKEN_BUDGET  # prefilled in chunks
    for row in greedy[3:5]:  # PREFIX + ...: at least two 16-token blocks reused
        assert row["num_cached_tokens"] >= 2 * BLOCK_SIZE, row
    long_row, one = _rows(run, "one_token_behind_long")
    assert len(long_row["prompt_token_ids"]) == 3 * TOKEN_BUDGET
    assert len(one["prompt_token_ids"]) == 1
    assert len(_rows(run, "one_token_alone")[0]["prompt_token_ids"]) == 1


GDN_OPS = {
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "chunk_gated_delta_rule",
    "fused_gdn_gating",
    "fused_recurrent_gated_delta_rule",
}


def _assert_gdn_on_the_seam(run: dict) -> None:
    (info,) = run["serving"]
    assert info["platform"].endswith("KunlunHostEmulationPlatform")
    # vLLM's Qwen3-Next layers ran every GDN kernel through the plugin's seam.
    ran = {(k["op"], k["path"]) for k in info["gdn_kernels"]}
    assert ran == {(op, "portable") for op in GDN_OPS}, info["gdn_kernels"]


def test_dense_layout_greedy_matches_transformers(dense: dict) -> None:
    _assert_greedy_matches(dense)
    _assert_paths_exercised(dense)
    _assert_gdn_on_the_seam(dense)
