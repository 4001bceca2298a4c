"""With KunlunPlatform active on torch 2.5.1, every vLLM module a GPU worker imports
imports (the schema fix is what makes vllm.config importable)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import run_python

pytestmark = pytest.mark.skipif(
    not torch.__version__.startswith("2.5."), reason="the fix targets torch 2.5.1"
)

# What vllm.v1.worker.gpu_worker.Worker pulls in on the way to a first decode step.
WORKER_MODULES = [
    "vllm.config",
    "vllm.distributed.parallel_state",
    "vllm.model_executor.layers.quantization.utils.fp8_utils",
    "vllm.v1.worker.gpu_worker",
    "vllm_kunlun.platforms.worker",  # the worker KunlunPlatform selects (registers our models)
    "vllm_kunlun.models.qwen3_5",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.sample.sampler",
    "vllm.v1.sample.rejection_sampler",
    "vllm.v1.spec_decode.eagle",
    "vllm.v1.attention.backends.triton_attn",
    "vllm.model_executor.model_loader",
    "vllm.model_executor.models.qwen2",
    "vllm.model_executor.models.qwen3",
    "vllm.model_executor.models.qwen3_moe",
    "vllm.v1.engine.core",
    "vllm.v1.executor.multiproc_executor",
    "vllm.compilation.decorators",
    "vllm.compilation.backends",
]

CODE = """
import importlib, json, traceback
results = {}
for name in MODULES:
    try:
        importlib.import_module(name)
        results[name] = "ok"
    except Exception as exc:
        results[name] = f"{type(exc).__name__}: {exc}"[:400]
print("RESULT " + json.dumps(results))
"""


def _import_all(env: dict[str, str]) -> dict[str, str]:
    proc = run_python(f"MODULES = {WORKER_MODULES!r}\n" + CODE, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_every_worker_module_imports_under_kunlun() -> None:
    results = _import_all({"FAKE_XMLIR_DEVICES": "8"})
    failed = {k: v for k, v in results.items() if v != "ok"}
    assert failed == {}


def test_without_the_fix_vllm_config_does_not_import() -> None:
    # Proves the test above depends on the fix (not on a lucky vLLM build).
    results = _import_all({"FAKE_XMLIR_DEVICES": "8", "VLLM_KUNLUN_SCHEMA_FIX": "0"})
    assert "list[int]" in results["vllm.config"]
