"""End to end in host emulation: a compressed-tensors W4A16 ``pack-quantized``
checkpoint (attention per group of 32, symmetric; MLP per channel with zero points).

The tiny Qwen3 quantized by compressed-tensors' own compressor
(``vllm_kunlun.demo.tiny_int4``) is served by vLLM 0.15.1 through the plugin
(multiprocessing engine: the mixed-precision kernel must be listed in the spawned
engine process too) with the vendor fakes installed and
``VLLM_KUNLUN_EMULATION_VENDOR=1``, so the symmetric layers run the vendor
``gptq_gemm`` path and the asymmetric ones the portable kernel, in one engine.
Reference (``int4_reference.py``): transformers' Qwen3 in float64 on the weights
compressed-tensors decompresses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.engine_specs import (
    EMULATION,
    GREEDY_PROMPTS,
    LLM_ARGS,
    req,
    run_spec,
)
from tests.integration.int4_reference import assert_matches_dequantized
from vllm_kunlun.demo.tiny_int4 import write_tiny_w4a16

pytestmark = pytest.mark.slow

TOKENS = 16
JOB = {
    "name": "greedy",
    "requests": [req(p, TOKENS, logprobs=1) for p in GREEDY_PROMPTS],
}
# No activation quantization: the float32 engine and the float64 reference differ by
# float rounding only (measured: below 1e-4 nats at every step).
LOGPROB_TOL = 1e-3


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work: Path = tmp_path_factory.mktemp("e2e-w4a16")
    model = str(write_tiny_w4a16(work / "tiny-qwen3-w4a16"))
    spec = {
        "backend": "vllm",
        "model": model,
        "llm": LLM_ARGS,
        "guard_exponential": False,
        "jobs": [JOB],
        "post": "int4_reference:post",
    }
    env = {**EMULATION, "VLLM_KUNLUN_EMULATION_VENDOR": "1"}
    return run_spec(spec, work, "w4a16", env=env)


def test_the_plugins_wna16_kernel_served_the_linear_layers(run: dict) -> None:
    (info,) = run["serving"]
    assert info["linear_kernels"] == [
        "vllm_kunlun.ops.int4.wna16_kernel.KunlunWNA16LinearKernel"
    ]
    # Symmetric attention layers on the vendor gptq_gemm (the fake), asymmetric MLP
    # layers on the portable kernel: both paths served calls.
    paths = {row["path"]: row["calls"] for row in info["wna16_kernels"]}
    assert set(paths) == {"vendor", "portable"}, info["wna16_kernels"]
    assert min(paths.values()) > 0


def test_greedy_equals_the_float64_dequantized_reference(run: dict) -> None:
    assert_matches_dequantized(run, LOGPROB_TOL, misses=0)
