"""End to end in host emulation: a GPTQ checkpoint (4-bit, ``desc_act`` with
``g_idx``, asymmetric, group 32, v1 zero points), float16.

The tiny Qwen3 quantized and packed as GPTQ stores it
(``vllm_kunlun.demo.tiny_int4.write_tiny_gptq``; the packing is checked against vLLM's
own ``gptq_pack`` in tests/unit/ops/test_int4_kernels.py) is served by vLLM 0.15.1
through the plugin's GPTQ linear method (runtime patch ``kunlun_gptq_linear_method``);
its activation order runs the portable kernel's permuted-K path. Reference
(``int4_reference.post_gptq``): transformers' Qwen3 in float64 on the weights
dequantized bit by bit in the reference. 8-bit, symmetric (vendor path) and
``desc_act`` false run layer by layer in the unit tests. The model has another shape
than the AWQ and W4A16 tests' tiny Qwen3 (3 layers, hidden 128, 8 query heads of 16
over 2 KV heads, intermediate 256: four groups per attention input, eight per
``down_proj``), so the 4-bit path is checked at two geometries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.engine_specs import GREEDY_PROMPTS, LLM_ARGS, req, run_spec
from tests.integration.int4_reference import assert_matches_dequantized
from vllm_kunlun.demo.tiny_int4 import write_tiny_gptq
from vllm_kunlun.demo.tiny_model import TinyQwen3Spec

pytestmark = pytest.mark.slow

TOKENS = 16
JOB = {
    "name": "greedy",
    "requests": [req(p, TOKENS, logprobs=1) for p in GREEDY_PROMPTS],
}
LOGPROB_TOL = 0.05  # float16 activations against float64 (test_e2e_awq.py)
SHAPE = TinyQwen3Spec(
    num_hidden_layers=3,
    hidden_size=128,
    intermediate_size=256,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=16,
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work: Path = tmp_path_factory.mktemp("e2e-gptq")
    model = str(write_tiny_gptq(work / "tiny-qwen3-gptq", spec=SHAPE))
    spec = {
        "backend": "vllm",
        "model": model,
        "llm": {**LLM_ARGS, "dtype": "float16"},
        "guard_exponential": False,
        "jobs": [JOB],
        "post": "int4_reference:post_gptq",
    }
    return run_spec(spec, work, "gptq")


def test_the_plugins_gptq_method_served_the_layers(run: dict) -> None:
    (info,) = run["serving"]
    (row,) = info["wna16_kernels"]
    assert row["path"] == "portable" and row["calls"] > 0, row


def test_greedy_equals_the_float64_dequantized_reference(run: dict) -> None:
    assert_matches_dequantized(run, LOGPROB_TOL, misses=1)
