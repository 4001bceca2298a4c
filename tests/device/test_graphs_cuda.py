"""On a CUDA-compatible GPU: KunlunPlatform's piecewise CUDA graphs decode exactly like
the eager engine, token for token.

The test-only torch_xmlir (tests/fakes) reports one device, so vLLM activates
KunlunPlatform as on a P800 host. Each attention backend runs twice on the tiny Qwen3:
graphs on (the platform's default: VLLM_COMPILE with the eager backend, PIECEWISE
graphs, decode-sized capture list) and ``enforce_eager``. Greedy tokens must be equal,
and equal to transformers' on the small batch; the graph engine must really have
captured graphs (the worker's count). Batches of 6 and 37 sequences replay graphs
padded to 8 and 40.

Needs the validated stack (vllm 0.15.1 on torch 2.5.1), a GPU, and the patch_torch251
set applied to that vLLM (``vllm-kunlun patch apply``; scripts/device_check.sh does
it); skipped otherwise, with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.device.cuda_stack import CUDA_STACK, KUNLUN_ON_CUDA
from tests.integration.engine_specs import (
    GREEDY_JOBS,
    LLM_ARGS,
    req,
    run_spec,
)
from vllm_kunlun.demo.tiny_model import vocabulary, write_tiny_model

pytestmark = CUDA_STACK  # a CUDA device and the validated stack

WORDS = [w for w in vocabulary() if w.isalpha()]  # the tiny model's whole words

WIDE = {
    "name": "wide",
    "requests": [
        req(" ".join(WORDS[(3 * i + j) % len(WORDS)] for j in range(6)), 24)
        for i in range(37)
    ],
}


@pytest.fixture(scope="module", autouse=True)
def patch_set_applied() -> None:
    from vllm_kunlun.file_patches import engine

    report = engine.inspect_tree()
    if report.pair_problem is None and report.applied != report.total:
        pytest.skip(
            f"{report.summary_line()}: graphs need it on torch 2.5.1; run "
            "`vllm-kunlun patch apply` first (scripts/device_check.sh does)"
        )


def _spec(model: str, backend: str, eager: bool) -> dict[str, Any]:
    return {
        "backend": "vllm",
        "model": model,
        "llm": {
            **LLM_ARGS,
            "max_num_seqs": 48,
            "max_num_batched_tokens": 256,
            "attention_backend": backend,
            "enforce_eager": eager,
            "kv_cache_memory_bytes": 1 << 30,
        },
        "jobs": [*GREEDY_JOBS, WIDE],
        "hf_jobs": GREEDY_JOBS if eager else [],
    }


@pytest.mark.parametrize("backend", ["TRITON_ATTN", "CUSTOM"])
def test_captured_decode_equals_eager(backend: str, tmp_path: Path) -> None:
    model = str(write_tiny_model(tmp_path / "tiny"))
    graphs = run_spec(
        _spec(model, backend, eager=False), tmp_path, f"graphs-{backend}",
        env=KUNLUN_ON_CUDA, timeout=600,
    )  # fmt: skip
    eager = run_spec(
        _spec(model, backend, eager=True), tmp_path, f"eager-{backend}",
        env=KUNLUN_ON_CUDA,
    )  # fmt: skip

    (info,) = graphs["serving"]
    assert info["platform"] == "vllm_kunlun.platforms.kunlun.KunlunPlatform"
    assert (info["compilation_mode"], info["cudagraph_mode"]) == (
        "VLLM_COMPILE",
        "PIECEWISE",
    )
    # 1, 2, 4, 8, ..., 48: 9 sizes, each captured once per capturable piece.
    assert info["cudagraphs_captured"] >= 9, info
    (plain,) = eager["serving"]
    assert (plain["cudagraph_mode"], plain["cudagraphs_captured"]) == ("NONE", 0)

    for job in ("warm_prefix", "greedy", "wide"):
        for got, want in zip(graphs["jobs"][job], eager["jobs"][job], strict=True):
            assert got["token_ids"] == want["token_ids"], (backend, job, got["text"])
    for job in ("warm_prefix", "greedy"):
        for got, want in zip(eager["jobs"][job], eager["hf"][job], strict=True):
            assert got["token_ids"] == want["token_ids"], (backend, job, got["text"])
