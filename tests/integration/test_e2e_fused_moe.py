"""End to end in host emulation: vLLM's own MoE layer (``FusedMoE`` / ``SharedFusedMoE``)
served by the plugin (``ops/moe/fused_moe_method.py``), greedy token for token equal to
transformers 5.2.0 for the families vLLM builds on it.

Tiny checkpoints written by transformers' own classes (``moe_families.py``): Qwen3-MoE
(softmax top-k, renormalised), Mixtral (its ``block_sparse_moe`` naming), GLM-4.5
(``Glm4MoeForCausalLM``: a dense first layer, sigmoid-scored grouped top-k with the
correction bias, routed scaling 2.5, a shared expert). One engine per configuration
(module-scoped), each job list in one run:
- ``qwen3_moe`` / ``mixtral`` / ``glm4_moe``: TP 1, engine core in the runner's process;
  chunked prefill (32-token budget), prefix-cache hits, 1-token prompts, mixed batches;
  GLM-4.5 with the vendor kernels asked for (``VLLM_KUNLUN_EMULATION_VENDOR=1``, the
  fakes of tests/fakes): its routing on ``moe_sigmoid_group_topk_norm``;
- ``mixtral_tp2``: Mixtral in another shape (16 experts, top-4) at tensor parallel 2
  (each expert's width split over the ranks);
- ``glm_ep2``: GLM-4.5 in another shape at TP 2 with ``--enable-expert-parallel``
  (each rank holds 8 of the 16 experts; the grouped routing crosses the ranks), portable;
- ``w8a8``: Qwen3-MoE quantized as released W8A8-INT8 checkpoints are (attention and
  experts int8, router and lm_head float) against transformers' model in float64 on the
  int8 weights x scales with vLLM's per-token activation quantization
  (``w8a8_reference.post_float64``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration import moe_families
from tests.integration.engine_specs import (
    EMULATION,
    GREEDY_PROMPTS,
    LLM_ARGS,
    TOKEN_BUDGET,
    assert_greedy_equal,
    assert_reference_not_degenerate,
    moe_paths,
    req,
    run_spec,
)
from tests.integration.hybrid_jobs import GREEDY_JOBS
from tests.integration.w8a8_reference import (
    Row,
    assert_greedy_matches,
    assert_logprobs_match,
)
from vllm_kunlun.demo.tiny_quant import quantize_checkpoint, select

pytestmark = pytest.mark.slow

RECORD_ENV = "FAKE_KUNLUN_OPS_RECORD"
TP_JOBS = GREEDY_JOBS[1:3]  # mixed batch with a chunked prefill; 1-token prompt
W8A8_JOB = {
    "name": "greedy",
    "requests": [req(p, 16, logprobs=1) for p in GREEDY_PROMPTS],
}
# Released W8A8 MoE checkpoints: attention and every expert int8, the router float.
W8A8_WEIGHTS = r"model\.layers\.\d+\.(self_attn|mlp\.experts\.\d+)\.\w+_proj\.weight"
W8A8_IGNORE = ("lm_head", "re:.*mlp.gate$")


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e_fused_moe")


def _run(
    work: Path,
    name: str,
    family: str,
    jobs: list[dict],
    llm: dict[str, Any] | None = None,
    **shape: Any,
) -> dict:
    model = str(moe_families.write(family, work / name, **shape))
    spec = {
        "backend": "vllm",
        "model": model,
        "llm": {**LLM_ARGS, **(llm or {})},
        "engine_in_process": True,
        "jobs": jobs,
        "hf_jobs": jobs,
        "hf_cache": True,
    }
    return run_spec(spec, work, name, timeout=900)


@pytest.fixture(scope="module")
def qwen3_moe(work: Path) -> dict:
    return _run(work, "qwen3_moe", "qwen3_moe", GREEDY_JOBS)


@pytest.fixture(scope="module")
def mixtral(work: Path) -> dict:
    return _run(work, "mixtral", "mixtral", GREEDY_JOBS)


@pytest.fixture(scope="module")
def mixtral_tp2(work: Path) -> dict:
    return _run(
        work,
        "mixtral_tp2",
        "mixtral",
        TP_JOBS,
        {"tensor_parallel_size": 2},
        num_experts=16,
        top_k=4,
        width=64,
    )


@pytest.fixture(scope="module")
def glm_ep2(work: Path) -> dict:
    return _run(
        work,
        "glm_ep2",
        "glm4_moe",
        TP_JOBS,
        {"tensor_parallel_size": 2, "enable_expert_parallel": True},
        num_experts=16,
        top_k=3,
        width=48,
    )


@pytest.fixture(scope="module")
def w8a8(work: Path) -> dict:
    from safetensors import safe_open

    model = moe_families.write("qwen3_moe", work / "w8a8", seed=7)
    with safe_open(str(model / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    quantize_checkpoint(model, select(names, W8A8_WEIGHTS), W8A8_IGNORE)
    spec = {
        "backend": "vllm",
        "model": str(model),
        "llm": LLM_ARGS,
        "engine_in_process": True,
        "jobs": [GREEDY_JOBS[0], W8A8_JOB],
        "post": "w8a8_reference:post_float64",
    }
    return run_spec(spec, work, "w8a8", timeout=900)


@pytest.fixture(scope="module")
def glm4_moe(work: Path) -> dict:
    """GLM-4.5 with the vendor kernels asked for (host emulation, the fakes): its
    grouped sigmoid routing runs on ``moe_sigmoid_group_topk_norm`` (its portable
    routing runs in ``glm_ep2``)."""
    import json

    model = str(moe_families.write("glm4_moe", work / "glm4_moe"))
    records = work / "glm4_moe.calls.jsonl"
    spec = {
        "backend": "vllm",
        "model": model,
        "llm": LLM_ARGS,
        "engine_in_process": True,
        "jobs": GREEDY_JOBS,
        "hf_jobs": GREEDY_JOBS,
        "hf_cache": True,
    }
    env = {**EMULATION, "VLLM_KUNLUN_EMULATION_VENDOR": "1", RECORD_ENV: str(records)}
    run = run_spec(spec, work, "glm4_moe", env=env, timeout=900)
    run["calls"] = [
        json.loads(line) for line in records.read_text().splitlines() if line
    ]
    return run


FAMILIES = ["qwen3_moe", "mixtral", "glm4_moe"]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_matches_transformers_token_for_token(
    family: str, request: pytest.FixtureRequest
) -> None:
    run = request.getfixturevalue(family)
    assert_greedy_equal(run, GREEDY_JOBS)
    assert_reference_not_degenerate(run)


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_prefill_and_one_token_prompts_were_exercised(
    family: str, request: pytest.FixtureRequest
) -> None:
    run = request.getfixturevalue(family)
    greedy = run["jobs"]["greedy"]
    assert len(greedy[2]["prompt_token_ids"]) > TOKEN_BUDGET
    assert len(run["jobs"]["one_token_alone"][0]["prompt_token_ids"]) == 1


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_vllms_moe_layer_ran_on_the_plugins_kernel(
    family: str, request: pytest.FixtureRequest
) -> None:
    paths = moe_paths(request.getfixturevalue(family))
    assert set(paths) == {"portable"} and paths["portable"] > 0


def test_tp2_greedy_matches_transformers(mixtral_tp2: dict) -> None:
    assert_greedy_equal(mixtral_tp2, TP_JOBS)
    assert len(mixtral_tp2["serving"]) == 2


def test_ep2_greedy_matches_transformers(glm_ep2: dict) -> None:
    assert_greedy_equal(glm_ep2, TP_JOBS)
    assert len(glm_ep2["serving"]) == 2


# ---- W8A8-INT8 experts (compressed-tensors) ---------------------------------------------


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


def test_w8a8_experts_ran_int8_on_the_plugins_kernel(w8a8: dict) -> None:
    (info,) = w8a8["serving"]
    assert info["int8_kernels"].startswith("portable (")
    assert moe_paths(w8a8)["portable"] > 0


def test_w8a8_greedy_equals_the_same_quantization_reference(w8a8: dict) -> None:
    assert_greedy_matches(_w8a8_rows(w8a8))


def test_w8a8_logprobs_match_the_same_quantization_reference(w8a8: dict) -> None:
    assert_logprobs_match(_w8a8_rows(w8a8))


# ---- the vendor routing kernel through the fakes ----------------------------------------


def test_every_glm_moe_layer_routed_on_the_vendor_kernel(glm4_moe: dict) -> None:
    """(Its greedy tokens == transformers: test_greedy_matches_transformers_...)"""
    paths = moe_paths(glm4_moe)
    assert set(paths) == {"vendor routing, portable experts"}, paths
    routed = [c for c in glm4_moe["calls"] if c["name"].startswith("moe_")]
    assert {c["name"] for c in routed} == {"moe_sigmoid_group_topk_norm"}
    assert len(routed) == sum(paths.values())
    for c in routed:
        assert c["args"]["n_group"] == 2 and c["args"]["topk_group"] == 1, c
        assert c["args"]["bias"]["shape"] == [16], c
