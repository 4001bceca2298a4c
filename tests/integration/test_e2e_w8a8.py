"""End to end in host emulation: a compressed-tensors W8A8-INT8 (dynamic) checkpoint.

The tiny Qwen3 quantized by ``vllm_kunlun.demo.tiny_quant`` is served by vLLM 0.15.1 through
the plugin (multiprocessing engine: the int8 kernel must be registered in the spawned
engine process too), and by ``vllm-kunlun demo --in-process`` (the in-process path).
References (``w8a8_reference.py``, run in the engine's runner after the jobs):
transformers' Qwen3 in float64 with vLLM's quantization (int8 weights x scales,
per-token ``absmax / 127`` activations), and transformers' own compressed-tensors
loading (``absmax / 127.5``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, child_env
from tests.docs_blocks import readme_demo_labels
from tests.integration.engine_specs import (
    EMULATION,
    GREEDY_PROMPTS,
    LLM_ARGS,
    check_demo_text,
    req,
    run_spec,
)
from tests.integration.w8a8_reference import (
    assert_greedy_matches,
    assert_logprobs_match,
)
from vllm_kunlun.demo.tiny_quant import write_tiny_w8a8

pytestmark = pytest.mark.slow

TOKENS = 16
JOB = {
    "name": "greedy",
    "requests": [req(p, TOKENS, logprobs=1) for p in GREEDY_PROMPTS],
}
# transformers' own path rounds activations with absmax / 127.5 instead of 127: a
# different int8 grid, whose rounding noise moves this tiny model's logprobs by up to
# 0.18 nats (measured over the 96 steps below; the float64 reference on
# compressed-tensors' grid stays within 0.04 of transformers). A token can only flip
# where the top-2 margin is below the sum of the two logprobs' moves, so tokens are
# compared where the margin is at least twice the tolerance (62 of 96 steps here); the
# issue's 0.05 is too small for a 64-wide model (3 steps with margins up to 0.21 flip).
TRANSFORMERS_TOL = 0.3
MARGIN = 2 * TRANSFORMERS_TOL


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e-w8a8")


@pytest.fixture(scope="module")
def model_dir(work: Path) -> str:
    return str(write_tiny_w8a8(work / "tiny-qwen3-w8a8"))


@pytest.fixture(scope="module")
def run(model_dir: str, work: Path) -> dict[str, Any]:
    spec = {
        "backend": "vllm",
        "model": model_dir,
        "llm": LLM_ARGS,  # float32: the engine's activations are float32
        "guard_exponential": False,  # multiprocessing engine
        "jobs": [JOB],
        "post": "w8a8_reference:post",
    }
    return run_spec(spec, work, "w8a8")


def _rows(run: dict[str, Any]) -> list[tuple[dict, list[int], dict, dict]]:
    post = run["post"]
    return list(
        zip(
            run["jobs"]["greedy"],
            post["float64_greedy"]["greedy"],
            post["float64"]["greedy"],
            post["transformers"]["greedy"],
            strict=True,
        )
    )


def test_the_plugins_int8_kernel_served_the_linear_layers(run: dict) -> None:
    (info,) = run["serving"]
    assert info["linear_kernels"] == [
        "vllm_kunlun.ops.int8.int8_kernel.KunlunInt8ScaledMMLinearKernel"
    ]
    # Host emulation without VLLM_KUNLUN_EMULATION_VENDOR=1 wants no vendor kernel.
    assert info["int8_kernels"].startswith(
        "portable (host emulation takes the portable paths"
    )


def test_greedy_equals_the_float64_same_quantization_reference(run: dict) -> None:
    assert_greedy_matches([(g, w, r) for g, w, r, _ in _rows(run)])


def test_logprobs_match_the_same_quantization_reference(run: dict) -> None:
    assert_logprobs_match([(g, w, r) for g, w, r, _ in _rows(run)])


def test_teacher_forced_against_transformers_compressed_tensors(run: dict) -> None:
    compared = 0
    for got, _, _, hf in _rows(run):
        for step, (tok, lp) in enumerate(
            zip(got["token_ids"], got["logprobs"], strict=True)
        ):
            assert abs(lp - hf["logprobs"][step]) < TRANSFORMERS_TOL, (step, lp)
            if hf["margin"][step] >= MARGIN:
                assert tok == hf["argmax"][step], (step, got["token_ids"])
                compared += 1
    assert compared >= len(GREEDY_PROMPTS) * TOKENS // 2  # the check had teeth


def test_the_gap_to_transformers_is_the_rounding_convention(run: dict) -> None:
    """The float64 reference on compressed-tensors' grid (absmax / 127.5) is closer to
    transformers than the engine (vLLM's absmax / 127) is: the difference above is the
    documented rounding convention, not an error of the kernel."""
    post = run["post"]
    ours, theirs = [], []
    for got, ct, hf in zip(
        run["jobs"]["greedy"],
        post["float64_127_5"]["greedy"],
        post["transformers"]["greedy"],
        strict=True,
    ):
        ours += [
            abs(a - b) for a, b in zip(got["logprobs"], hf["logprobs"], strict=True)
        ]
        theirs += [
            abs(a - b) for a, b in zip(ct["logprobs"], hf["logprobs"], strict=True)
        ]
    # measured: 0.48 vs 3.93 nats summed over 96 steps
    assert sum(theirs) < 0.25 * sum(ours), (sum(theirs), sum(ours))


def test_demo_generates_in_process(model_dir: str, work: Path) -> None:
    out = work / "demo.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_kunlun.cli",
            "demo",
            "--model",
            model_dir,
            "--in-process",
            "--max-tokens",
            "6",
            "--json-out",
            str(out),
        ],
        env=child_env(EMULATION, fakes=False),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-3000:]
    report = json.loads(out.read_text())
    assert report["engine_mode"] == "in-process"
    assert report["output_tokens"] == 6 * len(report["generations"]) > 0
    (info,) = report["serving"]
    assert info["linear_kernels"] == [
        "vllm_kunlun.ops.int8.int8_kernel.KunlunInt8ScaledMMLinearKernel"
    ]
    assert "linear kernels  : " in proc.stdout
    check_demo_text(proc)  # the report alone; vLLM's log in the file it names
    # README's demo output block shows the lines this run printed.
    labels = {line.split(":")[0].rstrip() for line in proc.stdout.splitlines()}
    assert readme_demo_labels() <= labels, (readme_demo_labels(), proc.stdout)
