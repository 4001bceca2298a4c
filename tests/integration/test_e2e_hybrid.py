"""End to end in host emulation: the tiny Qwen3.5 hybrid (3 Gated DeltaNet layers + 1
gated full-attention layer) through vLLM 0.15.1's engine and the plugin, greedy, token
for token equal to transformers 5.2.0.

Two engines, one per configuration (module-scoped):
- ``composite``: the vision-language composite checkpoint (the log's layout), engine core
  in this interpreter so the ``exponential_`` guard sees it; hybrid KV cache, chunked
  prefill (32-token budget), prefix caching (vLLM's ``align`` mode, portable block copy),
  a small block pool so that state slots are recycled between jobs, then transformers'
  greedy reference in the same interpreter.
- ``demo``: ``vllm-kunlun demo --model <tiny causal Qwen3.5> --in-process`` with
  ``VLLM_PLUGINS=kunlun`` (no general plugin): the model is registered by the platform
  hook and the worker, not by the general plugin. (The multiprocessing demo path is
  covered by the Qwen3 e2e test; that the worker constructor registers, by a unit test.
  In-process saves a second engine interpreter: about 30 s of this file's budget.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, child_env
from tests.integration.engine_specs import (
    BLOCK_SIZE,
    TOKEN_BUDGET,
    engine_spec,
    req,
    run_spec,
)
from tests.integration.hybrid_jobs import (
    DISTRIBUTION,
    GREEDY_JOBS,
    GREEDY_TOKENS,
    LLM_ARGS,
    SEEDED_A,
    SEEDED_B,
)
from tests.integration.sampling_reference import assert_follows_reference
from vllm_kunlun.demo.run import DEFAULT_PROMPTS
from vllm_kunlun.demo.tiny_model import write_tiny_model
from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec

pytestmark = pytest.mark.slow

IMAGE = {
    "name": "image",
    "expect_error": True,
    "requests": [{**req("the quick brown fox", 4), "image": True}],
}
DEMO_TOKENS = 12
DEMO = {"name": "demo", "requests": [req(p, DEMO_TOKENS) for p in DEFAULT_PROMPTS]}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e_hybrid")


@pytest.fixture(scope="module")
def checkpoints(work: Path) -> dict[str, str]:
    return {
        layout: str(write_tiny_model(work / layout, TinyQwen3_5Spec(layout=layout)))
        for layout in ("causal", "composite")
    }


@pytest.fixture(scope="module")
def composite(checkpoints: dict[str, str], work: Path) -> dict:
    spec = engine_spec(
        checkpoints["composite"],
        [*GREEDY_JOBS, SEEDED_A, IMAGE, SEEDED_B, DISTRIBUTION],
        hf_jobs=GREEDY_JOBS,
        hf_cache=True,
        distribution=[DISTRIBUTION["name"]],
        hf_also={"model": checkpoints["causal"], "jobs": [DEMO], "hf_cache": True},
        llm=LLM_ARGS,
    )
    return run_spec(spec, work, "composite", timeout=600)


@pytest.fixture(scope="module")
def demo(checkpoints: dict[str, str], work: Path) -> tuple[dict, str]:
    out = work / "demo.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_kunlun.cli",
            "demo",
            "--model",
            checkpoints["causal"],
            "--max-tokens",
            str(DEMO_TOKENS),
            "--in-process",
            "--json-out",
            str(out),
            "--json",
        ],
        # A plain CPU host; only the platform plugin is allowed.
        env=child_env({"VLLM_PLUGINS": "kunlun"}, fakes=False),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-3000:]
    report = json.loads(out.read_text())
    # --json in process: vLLM's log (stdout by default) went to stderr.
    assert json.loads(proc.stdout) == report, proc.stdout[:3000]
    return report, proc.stderr


def _rows(run: dict, job: str) -> list[dict[str, Any]]:
    return run["jobs"][job]


def test_greedy_matches_transformers_token_for_token(composite: dict) -> None:
    hf = composite["hf"]
    for job in GREEDY_JOBS:
        name = job["name"]
        for got, want in zip(_rows(composite, name), hf[name], strict=True):
            assert got["prompt_token_ids"] == want["prompt_token_ids"]
            assert got["token_ids"] == want["token_ids"], (name, got["text"])


def test_the_reference_is_not_degenerate(composite: dict) -> None:
    for row in composite["hf"]["greedy"]:
        assert len(set(row["token_ids"])) >= GREEDY_TOKENS // 2, row


def test_chunked_prefill_prefix_cache_and_one_token_prompts_were_exercised(
    composite: dict,
) -> None:
    greedy = _rows(composite, "greedy")
    assert len(greedy[2]["prompt_token_ids"]) > TOKEN_BUDGET  # prefilled in chunks
    for row in greedy[3:5]:  # PREFIX + ...: at least two 16-token blocks reused
        assert row["num_cached_tokens"] >= 2 * BLOCK_SIZE, row
    long_row, one = _rows(composite, "one_token_behind_long")
    assert len(long_row["prompt_token_ids"]) == 3 * TOKEN_BUDGET
    assert len(one["prompt_token_ids"]) == 1
    assert len(_rows(composite, "one_token_alone")[0]["prompt_token_ids"]) == 1


def test_no_exponential_during_the_run(composite: dict) -> None:
    assert composite["exponential_calls"] == []


def test_seeded_sampling_is_reproducible_in_any_batch(composite: dict) -> None:
    a, b = _rows(composite, "seeded_a"), _rows(composite, "seeded_b")
    assert b[2]["token_ids"] == a[0]["token_ids"]  # the chunked long prompt
    assert b[1]["token_ids"] == a[1]["token_ids"]
    assert a[1]["token_ids"] != a[2]["token_ids"]  # another seed, other draws
    greedy_fox = composite["hf"]["greedy"][0]["token_ids"][:12]
    assert a[1]["token_ids"] != greedy_fox  # it samples


def test_sampling_follows_transformers_distribution(composite: dict) -> None:
    """The draws are the model's, not only repeatable: chi-square against
    transformers' softmax of the same logits at temperature 1."""
    assert_follows_reference(composite)


def test_an_image_without_its_placeholder_is_refused_and_the_engine_keeps_serving(
    composite: dict,
) -> None:
    """The composite takes images (tests/integration/test_e2e_vision.py); a raw
    prompt without the image's placeholder is refused by vLLM's processor."""
    (row,) = _rows(composite, "image")
    assert row["error"] is not None
    assert "Failed to apply prompt replacement for mm_items['image'][0]" in row["error"]
    # SEEDED_B ran after the refusal.
    assert len(_rows(composite, "seeded_b")) == len(SEEDED_B["requests"])


def test_serving_path_is_the_plugins(composite: dict) -> None:
    (info,) = composite["serving"]
    assert (
        info["platform"]
        == "vllm_kunlun.platforms.emulation.KunlunHostEmulationPlatform"
    )
    assert info["attention_impls"] == [
        "vllm_kunlun.ops.attention.backend.PortableAttentionImpl"
    ]


def test_demo_serves_the_causal_layout_without_the_general_plugin(
    demo: tuple[dict, str], composite: dict
) -> None:
    report, log = demo
    assert report["engine_mode"] == "in-process"
    (info,) = report["serving"]
    assert info["platform"].endswith("KunlunHostEmulationPlatform")
    assert "VLLM_PLUGINS=kunlun does not include kunlun_runtime_fixes" in log
    # The worker applied the sampling patches without the general plugin.
    assert info["topk_topp_sampler"].endswith("KunlunTopKTopPSampler")
    got = [g["token_ids"] for g in report["generations"]]
    assert got == [row["token_ids"] for row in composite["hf_also"]["demo"]]
    assert report["output_tokens"] == DEMO_TOKENS * len(DEFAULT_PROMPTS)
    assert "GDN kernel chunk_gated_delta_rule on cpu: portable" in log
