"""Pipeline parallel in host emulation with vLLM's mp executor: every stage holds only
its own layers (weights, KV pages, GDN state), and greedy output is token for token
transformers 5.2.0's on the whole model.

One engine per configuration (module-scoped), each with its own reference:
- ``hybrid``: the tiny Qwen3.5 composite (GDN, GDN | GDN, attention) at PP 2, with
  chunked prefill, prefix-cache hits, 1-token prompts and seeded sampling.
- ``moe``: the tiny Qwen3.5-MoE composite at PP 2.
TP 2 x PP 2 (four workers) runs on the Ray executor across two nodes
(test_e2e_ray.py): vLLM's own Qwen3 (the dense model the demo serves), and ``SIX``
here, another hybrid shape (6 layers, attention every second, embeddings tied to
``lm_head``) split unevenly (``VLLM_PP_LAYER_PARTITION=2,4``: the last stage needs the
embedding only for its ``lm_head``). An engine of four workers costs minutes on the
2-core CI, so each configuration runs once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.engine_specs import (
    EMULATION,
    TOKEN_BUDGET,
    run_spec,
)
from tests.integration.hybrid_jobs import (
    DISTRIBUTION,
    GREEDY_JOBS,
    LLM_ARGS,
    SEEDED_A,
    SEEDED_B,
)
from tests.integration.pipeline_runs import stage_layers
from tests.integration.sampling_reference import assert_follows_reference
from vllm_kunlun.demo.tiny_model import write_tiny_model
from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec
from vllm_kunlun.demo.tiny_qwen3_5_moe import TinyQwen3_5MoeSpec

pytestmark = pytest.mark.slow

SHORT_JOBS = GREEDY_JOBS[1:3]  # mixed batch with a chunked prefill; 1-token prompt
PP2 = {"pipeline_parallel_size": 2}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e_pp")


def _run(
    work: Path,
    name: str,
    model: str,
    llm: dict[str, Any],
    jobs: list[dict[str, Any]],
    hf_jobs: list[dict[str, Any]] | None = None,
    env: dict[str, str] | None = None,
    **extra: Any,
) -> dict:
    spec = {
        "backend": "vllm",
        "model": model,
        "llm": llm,
        "engine_in_process": True,  # one process importing vLLM less; stages apart
        "jobs": jobs,
        "hf_jobs": jobs if hf_jobs is None else hf_jobs,
        "hf_cache": True,
        **extra,
    }
    return run_spec(spec, work, name, env={**EMULATION, **(env or {})}, timeout=900)


@pytest.fixture(scope="module")
def hybrid(work: Path) -> dict:
    model = str(write_tiny_model(work / "hybrid", TinyQwen3_5Spec(layout="composite")))
    return _run(
        work,
        "hybrid",
        model,
        {**LLM_ARGS, **PP2},
        [*GREEDY_JOBS, SEEDED_A, SEEDED_B, DISTRIBUTION],
        hf_jobs=GREEDY_JOBS,
        distribution=[DISTRIBUTION["name"]],
    )


@pytest.fixture(scope="module")
def moe(work: Path) -> dict:
    model = write_tiny_model(work / "moe", TinyQwen3_5MoeSpec(layout="composite"))
    return _run(work, "moe", str(model), {**LLM_ARGS, **PP2}, SHORT_JOBS)


def _assert_greedy_matches(run: dict) -> None:
    for name, want_rows in run["hf"].items():
        rows = run["jobs"][name]
        for got, want in zip(rows, want_rows, strict=True):
            assert got["prompt_token_ids"] == want["prompt_token_ids"]
            assert got["token_ids"] == want["token_ids"], (name, got["text"])


def test_hybrid_greedy_matches_transformers(hybrid: dict) -> None:
    _assert_greedy_matches(hybrid)


def test_hybrid_exercised_chunks_prefix_hits_and_one_token_prompts(
    hybrid: dict,
) -> None:
    greedy = hybrid["jobs"]["greedy"]
    assert len(greedy[2]["prompt_token_ids"]) > TOKEN_BUDGET  # prefilled in chunks
    assert all(row["num_cached_tokens"] >= 32 for row in greedy[3:5])
    assert len(hybrid["jobs"]["one_token_alone"][0]["prompt_token_ids"]) == 1


def test_hybrid_seeded_sampling_is_reproducible(hybrid: dict) -> None:
    a, b = hybrid["jobs"]["seeded_a"], hybrid["jobs"]["seeded_b"]
    assert b[2]["token_ids"] == a[0]["token_ids"]
    assert b[1]["token_ids"] == a[1]["token_ids"]
    assert a[1]["token_ids"] != a[2]["token_ids"]  # another seed, other draws


def test_hybrid_sampling_follows_transformers_distribution(hybrid: dict) -> None:
    """The draws across the two stages are the model's, not only repeatable:
    chi-square against transformers' softmax of the same logits at temperature 1."""
    assert_follows_reference(hybrid)


def test_each_hybrid_stage_holds_only_its_layers(hybrid: dict) -> None:
    # 4 layers (GDN x 3, attention) in two stages of two: the first stage has no
    # attention layer at all (vLLM keeps the group, empty: the stages share one KV
    # cache layout), the second one GDN and one attention layer.
    assert stage_layers(hybrid) == [
        {"MambaSpec": 2, "FullAttentionSpec": 0},
        {"MambaSpec": 1, "FullAttentionSpec": 1},
    ]


def test_moe_greedy_matches_transformers(moe: dict) -> None:
    _assert_greedy_matches(moe)
    experts = [info["moe_experts"] for info in moe["serving"]]
    assert all(
        e is not None and e["local_experts"] == e["num_experts"] for e in experts
    )
