"""End to end in host emulation: an AWQ GEMM checkpoint (4-bit, zero points, group
32), float16, tensor parallel 2.

The tiny Qwen3 quantized the way AutoAWQ quantizes and packs
(``vllm_kunlun.demo.tiny_int4.write_tiny_awq``; the packing is checked against vLLM's
own ``awq_pack`` in tests/unit/ops/test_int4_kernels.py) is served by vLLM 0.15.1
through the plugin's AWQ linear method (runtime patch ``kunlun_awq_linear_method``) on
two ranks: the row-parallel projections split their 4 groups 2 per rank. Reference
(``int4_reference.post_awq``): transformers' Qwen3 in float64 on the weights dequantized
by AutoAWQ's unpacking written out in the reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.engine_specs import GREEDY_PROMPTS, LLM_ARGS, req, run_spec
from tests.integration.int4_reference import assert_matches_dequantized
from vllm_kunlun.demo.tiny_int4 import write_tiny_awq

pytestmark = pytest.mark.slow

TOKENS = 16
JOB = {
    "name": "greedy",
    "requests": [req(p, TOKENS, logprobs=1) for p in GREEDY_PROMPTS],
}
# float16 activations against float64: each layer's output rounds to float16 (2^-11
# relative), which moves this tiny model's logprobs by up to ~1e-2 nats.
LOGPROB_TOL = 0.05


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work: Path = tmp_path_factory.mktemp("e2e-awq")
    model = str(write_tiny_awq(work / "tiny-qwen3-awq"))
    spec = {
        "backend": "vllm",
        "model": model,
        "llm": {**LLM_ARGS, "dtype": "float16", "tensor_parallel_size": 2},
        "guard_exponential": False,
        "jobs": [JOB],
        "post": "int4_reference:post_awq",
    }
    return run_spec(spec, work, "awq", timeout=600)


def test_the_plugins_awq_method_served_every_rank(run: dict) -> None:
    assert len(run["serving"]) == 2
    for info in run["serving"]:
        (row,) = info["wna16_kernels"]
        assert row["path"] == "portable" and row["calls"] > 0, row


def test_greedy_equals_the_float64_dequantized_reference(run: dict) -> None:
    assert_matches_dequantized(run, LOGPROB_TOL, misses=1)
