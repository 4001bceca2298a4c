"""On a CUDA-compatible GPU: the real KunlunPlatform (CUDA-compatibility mode) serves
vLLM's engine and greedy output equals transformers' token for token.

The test-only torch_xmlir (tests/fakes) reports one device, so vLLM activates
KunlunPlatform exactly as on a P800 host; the GPU stands in for the Kunlun card. Needs
the validated stack (vllm 0.15.1 on torch 2.5.1) and a GPU; skipped otherwise, with
the reason. scripts/device_check.sh runs it.

The fake kunlun_ops is importable too, so KunlunPlatform routes its CustomOps (norms,
rotary, SiLU-and-mul) to the fake kernels on the GPU, and with no backend named it
picks the Kunlun attention backend on them: the vendor seam runs on a real device.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.device.cuda_stack import CUDA_STACK, KUNLUN_ON_CUDA
from tests.integration.engine_specs import (
    GREEDY_JOBS,
    LLM_ARGS,
    run_spec,
)
from vllm_kunlun.demo.tiny_model import write_tiny_model

pytestmark = CUDA_STACK


@pytest.mark.parametrize("backend", ["TRITON_ATTN", "CUSTOM", None])
def test_greedy_matches_transformers_on_cuda(
    backend: str | None, tmp_path: Path
) -> None:
    model = str(write_tiny_model(tmp_path / "tiny"))
    chosen = {"attention_backend": backend} if backend else {}
    spec = {
        "backend": "vllm",
        "model": model,
        "llm": {
            **LLM_ARGS,
            **chosen,
            "enforce_eager": True,
            "kv_cache_memory_bytes": 1 << 30,
        },
        "jobs": GREEDY_JOBS,
        "hf_jobs": GREEDY_JOBS,
    }
    # Host emulation off, one fake Kunlun device: vLLM picks KunlunPlatform.
    result = run_spec(
        spec, tmp_path, f"cuda-{backend or 'default'}", env=KUNLUN_ON_CUDA
    )
    (info,) = result["serving"]
    assert info["platform"] == "vllm_kunlun.platforms.kunlun.KunlunPlatform"
    expected = backend or "KunlunAttentionBackend"  # the default with kunlun_ops
    assert any(expected in b for b in info["attention_backends"]), info
    for job in ("warm_prefix", "greedy"):
        for got, want in zip(result["jobs"][job], result["hf"][job], strict=True):
            assert got["token_ids"] == want["token_ids"], (backend, got["text"])
