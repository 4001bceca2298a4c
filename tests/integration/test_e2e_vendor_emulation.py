"""End to end through the vendor-kernel paths in host emulation.

``VLLM_KUNLUN_EMULATION_VENDOR=1`` with tests/fakes on the path: vLLM 0.15.1's engine
runs the Kunlun attention backend, the CustomOps replaced for the vendor kernels and
the vendor sampler, all calling the fake ``kunlun_ops`` (plain-torch kernels with the
observed semantics; the sampling fake draws with flashinfer's semantics). The fakes
append every call to a file (``FAKE_KUNLUN_OPS_RECORD``), so calls made in engine
processes the test did not start are seen too. The reference is transformers' greedy
decoding of the tiny Qwen3; for unseeded top-k sampling, vLLM's own logprobs of the
model's distribution (every draw in its top k, ranks by Pearson's chi-square).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from tests.integration.engine_specs import (
    BLOCK_SIZE,
    DEMO_TOKENS,
    EMULATION,
    GREEDY_JOBS,
    GREEDY_PROMPTS,
    LONG_PROMPT,
    PREFIX,
    TOKEN_BUDGET,
    engine_spec,
    req,
    run_demo_cli,
    run_spec,
)
from tests.unit.sampler_reference import ALPHA
from vllm_kunlun.demo.run import DEFAULT_PROMPTS
from vllm_kunlun.demo.tiny_model import TinyQwen3Spec, write_tiny_model

pytestmark = pytest.mark.slow

VENDOR = {**EMULATION, "VLLM_KUNLUN_EMULATION_VENDOR": "1"}
RECORD_ENV = "FAKE_KUNLUN_OPS_RECORD"
LAYERS = TinyQwen3Spec().num_hidden_layers
# RMSNorm modules of a Qwen3 model: input, post-attention, q_norm, k_norm per layer,
# and the final norm.
NORMS = 4 * LAYERS + 1
ATTENTION_KERNELS = {"reshape_and_cache_flash", "paged_attention", "prefill_attention"}
NORM_KERNELS = {"rmsnorm", "add_rmsnorm"}
SAMPLED = {  # seeded: the portable kernel (the vendor's takes no per-row generator)
    "name": "sampled",
    "requests": [req("one two three", 8, temperature=0.8, top_k=5, seed=3)],
}
SEEDED_TOP_K = 5
# Unseeded, temperature 1, top-k K, with the model's top-K logprobs: the vendor kernel.
# One prompt for all: greedy decoding would give eight equal continuations. The prompts
# (8 x 3 tokens) fit one step's token budget, so no partial prefill's draw is discarded.
K = 4
TOP_K_TOKENS = 32
TOP_K_JOB = {
    "name": "top_k",
    "requests": [
        req("one two three", TOP_K_TOKENS, temperature=1.0, top_k=K, logprobs=K)
        for _ in range(8)
    ],
}
VENDOR_SAMPLER = "top_k_top_p_sampling_from_probs"
DEMO_JOB = {"name": "demo", "requests": [req(p, DEMO_TOKENS) for p in DEFAULT_PROMPTS]}


def read_calls(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e-vendor")


@pytest.fixture(scope="module")
def run(work: Path) -> dict:
    """One in-process engine: greedy (chunked prefill, prefix-cache hits), a seeded and
    eight unseeded sampled requests; then transformers' greedy reference in the same
    interpreter."""
    records = work / "calls.jsonl"
    spec = engine_spec(
        str(write_tiny_model(work / "tiny-qwen3")),
        [*GREEDY_JOBS, SAMPLED, TOP_K_JOB],
        hf_jobs=[*GREEDY_JOBS, DEMO_JOB],
    )
    result = run_spec(spec, work, "vendor", env={**VENDOR, RECORD_ENV: str(records)})
    result["calls"] = read_calls(records)
    return result


def test_greedy_matches_transformers_through_the_vendor_kernels(run: dict) -> None:
    for job in ("warm_prefix", "greedy"):
        for got, want in zip(run["jobs"][job], run["hf"][job], strict=True):
            assert got["prompt_token_ids"] == want["prompt_token_ids"]
            assert got["token_ids"] == want["token_ids"], got["text"]


def test_chunked_prefill_and_prefix_hits_ran_the_paged_prefill_kernel(
    run: dict,
) -> None:
    greedy = run["jobs"]["greedy"]
    long_row = greedy[GREEDY_PROMPTS.index(LONG_PROMPT)]
    assert len(long_row["prompt_token_ids"]) > TOKEN_BUDGET  # several chunks
    for i, prompt in enumerate(GREEDY_PROMPTS):
        if prompt.startswith(PREFIX):
            assert greedy[i]["num_cached_tokens"] >= 2 * BLOCK_SIZE, greedy[i]
    forms = Counter(
        c["args"]["is_prefix_cache"]
        for c in run["calls"]
        if c["name"] == "prefill_attention"
    )
    assert forms[True] > 0  # over the paged cache: chunks and prefix hits
    assert forms[False] > 0  # fresh prompts: within the new tokens
    assert any(c["name"] == "paged_attention" for c in run["calls"])  # decodes


def test_every_layer_ran_on_the_vendor_kernels(run: dict) -> None:
    calls = run["calls"]
    assert {c["pid"] for c in calls} == {run["serving"][0]["pid"]}
    # Each RMSNorm module (its own weight) ran once per forward pass.
    per_norm = Counter(
        c["args"]["weight"]["ptr"] for c in calls if c["name"] in NORM_KERNELS
    )
    assert len(per_norm) == NORMS, per_norm
    (forwards,) = set(per_norm.values())
    # Rotary embedding and SiLU-and-mul once per layer per forward pass.
    names = Counter(c["name"] for c in calls)
    assert names["rotary_embedding"] == LAYERS * forwards
    assert names["silu_and_mul"] == LAYERS * forwards
    # Every layer wrote its own KV cache and attended over it, equally often.
    writes = Counter(
        c["args"]["key_cache"]["ptr"]
        for c in calls
        if c["name"] == "reshape_and_cache_flash"
    )
    decodes = Counter(
        c["args"]["k_cache"]["ptr"] for c in calls if c["name"] == "paged_attention"
    )
    assert len(writes) == LAYERS and set(decodes) == set(writes)
    assert len(set(writes.values())) == 1 and len(set(decodes.values())) == 1
    # Every call's tensors were contiguous, as the kernels require (the fakes check).
    for c in calls:
        for arg in c["args"].values():
            if isinstance(arg, dict) and "contiguous" in arg:
                assert arg["contiguous"], c


def test_serving_report_matches_the_kernel_records(run: dict) -> None:
    (info,) = run["serving"]
    assert info["attention_impls"] == [
        "vllm_kunlun.ops.attention.kunlun.KunlunAttentionImpl"
    ]
    assert info["sampling_kernels"].startswith("vendor ")
    for cls, entry in info["custom_ops"].items():
        assert entry["forward"] == ["forward_oot"], cls
    assert info["custom_ops"]["vllm_kunlun.ops.custom_ops.norms.KunlunRMSNorm"] == {
        "modules": NORMS,
        "forward": ["forward_oot"],
    }
    names = Counter(c["name"] for c in run["calls"])
    status = info["vendor_kernels"]
    assert all(s["native_calls"] == 0 for s in status.values()), status
    assert status["rms_norm"]["vendor_calls"] == sum(names[n] for n in NORM_KERNELS)
    assert status["rotary_embedding"]["vendor_calls"] == names["rotary_embedding"]
    assert status["silu_and_mul"]["vendor_calls"] == names["silu_and_mul"]
    assert status["attention"]["vendor_calls"] == names["reshape_and_cache_flash"]
    assert status["attention"]["modules"] == LAYERS


def test_unseeded_draws_are_the_vendor_kernels_and_seeded_ones_are_not(
    run: dict,
) -> None:
    """Every token of the unseeded top-k requests is a draw the vendor kernel returned
    (read back from the engine process's records), made with their top_k; the seeded
    request never reached the kernel."""
    (seeded,) = run["jobs"]["sampled"]
    assert len(seeded["token_ids"]) == 8
    sampler_calls = [c for c in run["calls"] if c["name"] == VENDOR_SAMPLER]
    assert {c["pid"] for c in sampler_calls} == {run["serving"][0]["pid"]}
    assert all(c["args"]["probs"]["dtype"] == "float32" for c in sampler_calls)
    assert not any(SEEDED_TOP_K in c["args"]["top_k"]["values"] for c in sampler_calls)
    top_k_calls = [
        c for c in sampler_calls if c["args"]["top_k"]["values"] == [K] * len(c["out"])
    ]
    drawn = Counter(t for c in top_k_calls for t in c["out"])
    emitted = Counter(t for row in run["jobs"]["top_k"] for t in row["token_ids"])
    assert emitted.total() == len(TOP_K_JOB["requests"]) * TOP_K_TOKENS
    assert drawn == emitted


def test_unseeded_top_k_draws_follow_the_models_distribution(run: dict) -> None:
    """Temperature 1, top-k K: each token in the top K of the model's distribution (as
    vLLM's raw logprobs rank it), not always the first (eight different continuations
    of one prompt), and the ranks drawn as often as the renormalised top-K
    probabilities say: Pearson's chi-square over the K ranks, expected counts summed
    over the steps (fails at p < ALPHA; the engine's seed fixes the draws)."""
    rows = run["jobs"]["top_k"]
    assert len({tuple(r["token_ids"]) for r in rows}) == len(rows)
    counts = np.zeros(K)
    expected = np.zeros(K)
    for row in rows:
        for token, step in zip(row["token_ids"], row["top_logprobs"], strict=True):
            rank = {t: r for t, _, r in step}[token]
            assert 1 <= rank <= K, (token, step)
            top = sorted((lp for _, lp, r in step if r <= K), reverse=True)
            assert len(top) == K, step
            q = np.exp(np.array(top) - top[0])
            expected += q / q.sum()
            counts[rank - 1] += 1
    assert counts.sum() == len(rows) * TOP_K_TOKENS
    assert (expected >= 5).all(), expected  # the chi-square approximation holds
    pvalue = stats.chisquare(counts, expected).pvalue
    assert pvalue > ALPHA, (counts, expected, pvalue)


def test_demo_reports_the_kunlun_backend_and_vendor_kernels(
    work: Path, run: dict
) -> None:
    """``VLLM_KUNLUN_EMULATION_VENDOR=1 vllm-kunlun demo`` with the fakes on the path:
    host emulation (although the fake driver reports 8 devices), the engine core in a
    spawned process, every kernel call recorded there."""
    records = work / "demo-calls.jsonl"
    env = {"VLLM_KUNLUN_EMULATION_VENDOR": "1", RECORD_ENV: str(records)}
    # The dense Qwen3, this module's reference model (the hybrid's vendor path:
    # test_e2e_hybrid_geometry_vendor.py).
    report, proc = run_demo_cli(work, env, fakes=True, model="qwen3")
    assert report["emulation"] is True
    assert "VLLM_KUNLUN_EMULATION_VENDOR=1" in report["platform_choice"]
    (info,) = report["serving"]
    assert info["pid"] != report["demo_pid"]  # the engine core ran elsewhere
    assert any("KunlunAttentionBackend" in b for b in info["attention_backends"])
    status = info["vendor_kernels"]
    assert set(status) == {"attention", "rms_norm", "rotary_embedding", "silu_and_mul"}
    assert all(
        s["vendor_calls"] > 0 and s["native_calls"] == 0 for s in status.values()
    )
    calls = read_calls(records)
    assert {c["pid"] for c in calls} == {info["pid"]}
    assert {c["name"] for c in calls} >= ATTENTION_KERNELS
    got = [g["token_ids"] for g in report["generations"]]
    assert got == [row["token_ids"] for row in run["hf"]["demo"]]
    assert "KunlunAttentionBackend" in proc.stdout
    assert "kernels         : rms_norm" in proc.stdout
