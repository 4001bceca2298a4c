"""What the device tests need and how they put KunlunPlatform on a CUDA GPU, shared by
test_e2e_kunlun_cuda.py, test_graphs_cuda.py and test_hybrid_cuda.py: ``CUDA_STACK``,
the marks that skip them (with the reason) without a CUDA device or the validated stack
(vllm 0.15.1 on torch 2.5.1); ``KUNLUN_ON_CUDA``, the child environment in which the
test-only torch_xmlir (tests/fakes) reports one device, so vLLM activates KunlunPlatform
as on a P800 host."""

from __future__ import annotations

import importlib.util

import pytest
import torch

CUDA_STACK = [
    pytest.mark.device,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vllm is not installed"
    ),
    pytest.mark.skipif(
        not torch.__version__.startswith("2.5."),
        reason=f"vllm 0.15.1 is validated on torch 2.5.1, not {torch.__version__}",
    ),
]

KUNLUN_ON_CUDA = {"FAKE_XMLIR_DEVICES": "1", "VLLM_LOGGING_LEVEL": "INFO"}
