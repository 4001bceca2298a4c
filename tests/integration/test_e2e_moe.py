"""End to end in host emulation: Qwen3.5-MoE (the hybrid with a routed MoE in every
layer) through vLLM 0.15.1's engine and the plugin, greedy token for token equal to
transformers 5.2.0's ``Qwen3_5Moe*`` modeling code.

One engine per configuration (module-scoped), each with its own reference:
- ``composite``: the tiny composite (8 experts, top-2, a shared expert), engine core in
  this interpreter with the ``exponential_`` guard: chunked prefill (32-token budget),
  a prefix-cache hit, 1-token prompts, mixed prefill/decode batches, seeded sampling;
  portable kernels.
- ``vendor``: the same checkpoint with ``VLLM_KUNLUN_EMULATION_VENDOR=1`` and the fake
  ``kunlun_ops`` (tests/fakes): the routed block runs on ``moe_ffn_block`` (recorded
  per call), the rest on the other vendor fakes.
- ``wide_tp2`` / ``wide_ep2``: another shape (16 experts, top-4, expert width 48,
  shared width 32, causal layout) at tensor parallel 2, the experts' width split over
  the ranks; and with ``--enable-expert-parallel``, each rank holding 8 whole experts.
- ``w8a8``: the composite quantized as released W8A8 checkpoints are (int8 experts,
  shared expert, attention and GDN linears; routers, vision tower, MTP head and
  lm_head float), against transformers' model in float64 on the int8 weights x scales
  with vLLM's per-token activation quantization in front of every int8 matmul
  (``w8a8_reference.post_float64``).
Broken MoE checkpoints (a missing expert, a wrong expert count or shape, a missing
scale) are refused naming the tensor: ``checkpoint_mutations.py``'s ``qwen3_5_moe_*``
cases, run by test_checkpoint_guard.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.engine_specs import (
    EMULATION,
    GREEDY_PROMPTS,
    TOKEN_BUDGET,
    assert_greedy_equal,
    engine_spec,
    moe_paths,
    req,
    run_spec,
)
from tests.integration.hybrid_jobs import (
    DISTRIBUTION,
    GREEDY_JOBS,
    LLM_ARGS,
    SEEDED_A,
    SEEDED_B,
)
from tests.integration.sampling_reference import assert_follows_reference
from tests.integration.w8a8_reference import (
    Row,
    assert_greedy_matches,
    assert_logprobs_match,
)
from vllm_kunlun.demo.tiny_model import write_tiny_model
from vllm_kunlun.demo.tiny_quant import write_tiny_w8a8
from vllm_kunlun.demo.tiny_qwen3_5_moe import TinyQwen3_5MoeSpec

pytestmark = pytest.mark.slow

TINY = TinyQwen3_5MoeSpec(layout="composite")
WIDE = TinyQwen3_5MoeSpec(
    layout="causal",
    num_experts=16,
    num_experts_per_tok=4,
    moe_intermediate_size=48,
    shared_expert_intermediate_size=32,
)
VENDOR = {**EMULATION, "VLLM_KUNLUN_EMULATION_VENDOR": "1"}
RECORD_ENV = "FAKE_KUNLUN_OPS_RECORD"
W8A8_JOB = {
    "name": "greedy",
    "requests": [req(p, 16, logprobs=1) for p in GREEDY_PROMPTS],
}
TP_JOBS = GREEDY_JOBS[1:3]  # mixed batch with a chunked prefill; 1-token prompt


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e_moe")


@pytest.fixture(scope="module")
def tiny(work: Path) -> str:
    return str(write_tiny_model(work / "tiny", TINY))


@pytest.fixture(scope="module")
def wide(work: Path) -> str:
    return str(write_tiny_model(work / "wide", WIDE))


@pytest.fixture(scope="module")
def composite(tiny: str, work: Path) -> dict:
    spec = engine_spec(
        tiny,
        [*GREEDY_JOBS, SEEDED_A, SEEDED_B, DISTRIBUTION],
        hf_jobs=GREEDY_JOBS,
        hf_cache=True,
        distribution=[DISTRIBUTION["name"]],
    )
    return run_spec(spec, work, "composite", timeout=600)


@pytest.fixture(scope="module")
def vendor(tiny: str, work: Path) -> dict:
    records = work / "vendor.calls.jsonl"
    spec = {
        "backend": "vllm",
        "model": tiny,
        "llm": LLM_ARGS,
        "engine_in_process": True,
        "jobs": GREEDY_JOBS,
    }
    run = run_spec(
        spec, work, "vendor", env={**VENDOR, RECORD_ENV: str(records)}, timeout=600
    )
    run["calls"] = [
        json.loads(line) for line in records.read_text().splitlines() if line
    ]
    return run


def _wide_run(wide: str, work: Path, name: str, extra: dict[str, Any]) -> dict:
    spec = {
        "backend": "vllm",
        "model": wide,
        "llm": {**LLM_ARGS, "tensor_parallel_size": 2, **extra},
        "engine_in_process": True,  # one process importing vLLM less; workers apart
        "jobs": TP_JOBS,
        "hf_jobs": TP_JOBS,
        "hf_cache": True,
    }
    return run_spec(spec, work, name, timeout=900)


@pytest.fixture(scope="module")
def wide_tp2(wide: str, work: Path) -> dict:
    return _wide_run(wide, work, "wide_tp2", {})


@pytest.fixture(scope="module")
def wide_ep2(wide: str, work: Path) -> dict:
    return _wide_run(wide, work, "wide_ep2", {"enable_expert_parallel": True})


@pytest.fixture(scope="module")
def w8a8(work: Path) -> dict:
    model = str(write_tiny_w8a8(work / "w8a8", TINY))
    spec = {
        "backend": "vllm",
        "model": model,
        "llm": LLM_ARGS,
        "engine_in_process": True,
        "jobs": [GREEDY_JOBS[0], W8A8_JOB],
        "post": "w8a8_reference:post_float64",
    }
    return run_spec(spec, work, "w8a8", timeout=600)


# ---- the tiny composite, portable kernels ---------------------------------------------


def test_greedy_matches_transformers_token_for_token(composite: dict) -> None:
    assert_greedy_equal(composite, GREEDY_JOBS)


def test_the_reference_is_not_degenerate(composite: dict) -> None:
    for row in composite["hf"]["greedy"]:
        assert len(set(row["token_ids"])) >= 8, row


def test_chunked_prefill_prefix_cache_and_one_token_prompts_were_exercised(
    composite: dict,
) -> None:
    greedy = composite["jobs"]["greedy"]
    assert len(greedy[2]["prompt_token_ids"]) > TOKEN_BUDGET
    for row in greedy[3:5]:  # PREFIX + ...: warmed by the first job
        assert row["num_cached_tokens"] >= 32, row
    assert len(composite["jobs"]["one_token_alone"][0]["prompt_token_ids"]) == 1


def test_seeded_sampling_is_reproducible_and_never_calls_exponential(
    composite: dict,
) -> None:
    a, b = composite["jobs"]["seeded_a"], composite["jobs"]["seeded_b"]
    assert b[2]["token_ids"] == a[0]["token_ids"]
    assert b[1]["token_ids"] == a[1]["token_ids"]
    assert a[1]["token_ids"] != a[2]["token_ids"]
    assert composite["exponential_calls"] == []


def test_sampling_follows_transformers_distribution(composite: dict) -> None:
    """The draws are the model's, not only repeatable: chi-square against
    transformers' softmax of the same logits at temperature 1."""
    assert_follows_reference(composite)


def test_the_portable_grouped_kernel_served_every_moe_layer(composite: dict) -> None:
    paths = moe_paths(composite)
    assert set(paths) == {"portable"} and paths["portable"] > 0


# ---- the vendor block through the fakes ------------------------------------------------


def test_vendor_path_greedy_matches_the_portable_engine(
    vendor: dict, composite: dict
) -> None:
    """The fake implements transformers' semantics: the vendor route must give the
    tokens the portable engine (== transformers) gave."""
    for job in GREEDY_JOBS:
        name = job["name"]
        got = [r["token_ids"] for r in vendor["jobs"][name]]
        assert got == [r["token_ids"] for r in composite["hf"][name]], name


def test_every_moe_layer_ran_on_moe_ffn_block(vendor: dict) -> None:
    paths = moe_paths(vendor)
    assert set(paths) == {"vendor"} and paths["vendor"] > 0
    blocks = [c for c in vendor["calls"] if c["name"] == "moe_ffn_block"]
    assert len(blocks) == paths["vendor"]
    # The router, both expert tensors whole (8 experts) and the routing settings.
    for c in blocks:
        args = c["args"]
        assert args["gate_w"]["shape"] == [TINY.num_experts, TINY.hidden_size], c
        assert args["inter_w"]["shape"][0] == TINY.num_experts, c
        assert args["moe_top_k"] == TINY.num_experts_per_tok, c


# ---- another shape at TP 2 and EP 2 ----------------------------------------------------


def test_tp2_greedy_matches_transformers(wide_tp2: dict) -> None:
    assert_greedy_equal(wide_tp2, TP_JOBS)
    assert len(wide_tp2["serving"]) == 2


def test_ep2_greedy_matches_transformers(wide_ep2: dict) -> None:
    assert_greedy_equal(wide_ep2, TP_JOBS)


def test_expert_parallel_gives_each_rank_half_the_experts(
    wide_tp2: dict, wide_ep2: dict
) -> None:
    def layouts(run: dict) -> list[dict[str, int]]:
        return sorted(
            (info["moe_experts"] for info in run["serving"]),
            key=lambda e: e["expert_start"],
        )

    tp, ep = layouts(wide_tp2), layouts(wide_ep2)
    half = WIDE.moe_intermediate_size // 2
    assert [(e["local_experts"], e["intermediate"]) for e in tp] == [(16, half)] * 2
    assert [(e["expert_start"], e["local_experts"]) for e in ep] == [(0, 8), (8, 8)]
    assert {e["intermediate"] for e in ep} == {WIDE.moe_intermediate_size}


# ---- W8A8 --------------------------------------------------------------------------


def _w8a8_rows(run: dict) -> list[Row]:
    post = run["post"]
    return list(
        zip(
            run["jobs"]["greedy"],
            post["float64_greedy"]["greedy"],
            post["float64"]["greedy"],
            strict=True,
        )
    )


def test_w8a8_experts_ran_int8(w8a8: dict) -> None:
    (info,) = w8a8["serving"]
    assert info["moe_experts"]["quantized"] is True
    assert info["int8_kernels"].startswith("portable (")
    assert moe_paths(w8a8)["portable"] > 0


def test_w8a8_greedy_equals_the_same_quantization_reference(w8a8: dict) -> None:
    assert_greedy_matches(_w8a8_rows(w8a8))


def test_w8a8_logprobs_match_the_same_quantization_reference(w8a8: dict) -> None:
    assert_logprobs_match(_w8a8_rows(w8a8))
