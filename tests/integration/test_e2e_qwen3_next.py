"""End to end in host emulation: Qwen3-Next through vLLM 0.15.1's own
``Qwen3NextForCausalLM`` (the plugin's subclass, models/qwen3_next.py) with its Gated
DeltaNet kernels on the plugin's GDN seam and its sparse blocks on vLLM's
``SharedFusedMoE`` served by the plugin (ops/moe), greedy token for token equal to
transformers 5.2.0's ``Qwen3NextForCausalLM`` on a tiny checkpoint that transformers
itself wrote (qwen3_next_checkpoint.py: 8 experts, top-2, a gated shared expert; three
GDN layers then a gated full-attention layer; layer 1 dense through ``mlp_only_layers``).

One engine per configuration (module-scoped):
- ``served``: portable kernels; chunked prefill (32-token budget), a prefix-cache hit,
  1-token prompts (alone, and queued behind a long prefill on a recycled state slot),
  mixed prefill/decode batches (test_e2e_hybrid.GREEDY_JOBS); transformers' reference
  in the same interpreter;
- ``mtp``: the same checkpoint with an (untrained) MTP head, served with
  ``--speculative-config '{"method": "qwen3_next_mtp", "num_speculative_tokens": 2}'``
  (vLLM's ``Qwen3NextMTP``) on the vendor kernels (``VLLM_KUNLUN_EMULATION_VENDOR=1``,
  the fake ``kunlun_ops`` of tests/fakes: the recurrent delta rule, MoE routing,
  paged attention, norms): drafts proposed every decode step, verified by the target,
  and the greedy output still transformers' (``served``'s reference; no prefix
  caching: vLLM 0.15.1 refuses it with speculative decoding on hybrid models).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.engine_specs import (
    BLOCK_SIZE,
    EMULATION,
    TOKEN_BUDGET,
    run_spec,
)
from tests.integration.hybrid_jobs import GREEDY_JOBS, GREEDY_TOKENS, LLM_ARGS
from tests.integration.qwen3_next_checkpoint import write_qwen3_next

pytestmark = pytest.mark.slow

VENDOR = {**EMULATION, "VLLM_KUNLUN_EMULATION_VENDOR": "1"}  # the fake kunlun_ops
LAYOUT = {"mlp_only_layers": [1]}  # layer 1 dense, the others sparse
# Without the prefix-cache warm-up: speculative decoding runs without prefix caching.
MTP_JOBS = GREEDY_JOBS[1:]
MTP_ARGS = {
    **LLM_ARGS,
    "enable_prefix_caching": False,
    "disable_log_stats": False,  # the spec-decode counters
    "speculative_config": {"method": "qwen3_next_mtp", "num_speculative_tokens": 2},
}
GDN_OPS = {
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "chunk_gated_delta_rule",
    "fused_gdn_gating",
    "fused_recurrent_gated_delta_rule",
}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e_qwen3_next")


@pytest.fixture(scope="module")
def served(work: Path) -> dict:
    model = write_qwen3_next(work / "moe", **LAYOUT)
    spec = {
        "backend": "vllm",
        "model": str(model),
        "llm": LLM_ARGS,
        "engine_in_process": True,
        "jobs": GREEDY_JOBS,
        "hf_jobs": GREEDY_JOBS,
        "hf_cache": True,
    }
    return run_spec(spec, work, "served", timeout=600)


@pytest.fixture(scope="module")
def mtp(work: Path, served: dict) -> dict:
    """The MTP engine; its reference is ``served``'s (the same target weights, checked
    here: the checkpoints differ only by ``mtp.*``), which saves a transformers run."""
    from safetensors.torch import load_file

    model = write_qwen3_next(work / "mtp", mtp=True, **LAYOUT)
    with_head = load_file(str(model / "model.safetensors"))
    target = load_file(str(work / "moe" / "model.safetensors"))
    assert {k for k in with_head if not k.startswith("mtp.")} == set(target)
    assert all(with_head[k].equal(v) for k, v in target.items())
    spec = {
        "backend": "vllm",
        "model": str(model),
        "llm": MTP_ARGS,
        "engine_in_process": True,
        "jobs": MTP_JOBS,
        "metrics": True,
    }
    run = run_spec(spec, work, "mtp", env=VENDOR, timeout=600)
    run["hf"] = served["hf"]
    return run


def _rows(run: dict, job: str) -> list[dict[str, Any]]:
    return run["jobs"][job]


def _assert_greedy_matches(run: dict, jobs: list[dict]) -> None:
    hf = run["hf"]
    for job in jobs:
        name = job["name"]
        for got, want in zip(_rows(run, name), hf[name], strict=True):
            assert got["prompt_token_ids"] == want["prompt_token_ids"]
            assert got["token_ids"] == want["token_ids"], (name, got["text"])
    for row in hf["greedy"]:  # the reference is not degenerate
        assert len(set(row["token_ids"])) >= GREEDY_TOKENS // 2, row


def _assert_shapes_exercised(run: dict) -> None:
    greedy = _rows(run, "greedy")
    assert len(greedy[2]["prompt_token_ids"]) > TOKEN_BUDGET  # prefilled in chunks
    long_row, one = _rows(run, "one_token_behind_long")
    assert len(long_row["prompt_token_ids"]) == 3 * TOKEN_BUDGET
    assert len(one["prompt_token_ids"]) == 1
    assert len(_rows(run, "one_token_alone")[0]["prompt_token_ids"]) == 1


def _assert_served_by_the_plugin(run: dict) -> None:
    """Portable kernels (host emulation's default)."""
    (info,) = run["serving"]
    assert info["platform"].endswith("KunlunHostEmulationPlatform")
    # vLLM's Qwen3-Next layers ran every GDN kernel through the plugin's seam ...
    ran = {(k["op"], k["path"]) for k in info["gdn_kernels"]}
    assert ran == {(op, "portable") for op in GDN_OPS}, info["gdn_kernels"]
    # ... and its sparse blocks on the plugin's grouped-expert kernel.
    paths = {k["path"] for k in info["moe_kernels"]}
    assert paths == {"portable"}, info["moe_kernels"]
    assert sum(int(k["calls"]) for k in info["moe_kernels"]) > 0


def _assert_served_by_the_vendor_kernels(run: dict) -> None:
    """``VLLM_KUNLUN_EMULATION_VENDOR=1``: the fake kunlun_ops where one is wired."""
    (info,) = run["serving"]
    ran = {k["op"]: k["path"] for k in info["gdn_kernels"]}
    # The recurrent delta rule (decode and draft verification) has a vendor kernel;
    # the other four have none wired and stay portable, named as such.
    assert ran == {
        **{op: "portable" for op in GDN_OPS},
        "fused_recurrent_gated_delta_rule": "vendor",
    }, info["gdn_kernels"]
    paths = {k["path"] for k in info["moe_kernels"]}
    assert paths == {"vendor routing, portable experts"}, info["moe_kernels"]
    assert info["attention_impls"] == [
        "vllm_kunlun.ops.attention.kunlun.KunlunAttentionImpl"
    ]
    attention = info["vendor_kernels"]["attention"]
    assert attention["vendor_calls"] > 0 and attention["native_calls"] == 0


def test_greedy_matches_transformers_token_for_token(served: dict) -> None:
    _assert_greedy_matches(served, GREEDY_JOBS)


def test_chunked_prefill_prefix_cache_and_one_token_prompts_were_exercised(
    served: dict,
) -> None:
    _assert_shapes_exercised(served)
    for row in _rows(served, "greedy")[3:5]:  # PREFIX + ...: two 16-token blocks
        assert row["num_cached_tokens"] >= 2 * BLOCK_SIZE, row


def test_gdn_and_experts_ran_on_the_plugins_kernels(served: dict) -> None:
    _assert_served_by_the_plugin(served)


def test_greedy_with_mtp_drafts_matches_transformers(mtp: dict) -> None:
    _assert_greedy_matches(mtp, MTP_JOBS)
    _assert_shapes_exercised(mtp)
    _assert_served_by_the_vendor_kernels(mtp)
    m = mtp["metrics"]
    drafts = m["vllm:spec_decode_num_draft_tokens"]
    accepted = m["vllm:spec_decode_num_accepted_tokens"]
    # Every decode step proposed 2 drafts; the untrained head's are mostly rejected,
    # and whatever was accepted or rejected, the output is the target's.
    assert drafts >= 2 * GREEDY_TOKENS, m
    assert 0 <= accepted <= drafts, m
