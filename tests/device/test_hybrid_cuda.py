"""On an accelerator: the GDN kernels the seam can pick, against the portable ones, and
the tiny Qwen3.5 hybrid served by KunlunPlatform, greedy == transformers.

- On a CUDA GPU with a Triton driver: vLLM's own Triton GDN kernels (what
  ``VLLM_KUNLUN_GDN=auto`` picks there) agree with ``gdn_portable``, which the unit tests
  hold to transformers' references; then the engine end to end with ``auto`` (Triton)
  and ``portable`` kernels.
- On a Kunlun host with the real ``kunlun_ops``: the vendor decode kernel through the
  seam agrees with the portable recurrence (the vendor semantics the plugin assumes from
  upstream usage are verified only here).
Skipped, with the reason, where the hardware or the stack is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.device.cuda_stack import CUDA_STACK
from tests.integration.engine_specs import run_spec
from tests.integration.hybrid_jobs import GREEDY_JOBS, LLM_ARGS
from vllm_kunlun.demo.tiny_model import write_tiny_model
from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec

# The e2e device test's conditions: a CUDA device, vLLM 0.15.1 on torch 2.5.1.
pytestmark = CUDA_STACK
DEVICE = torch.device("cuda", 0)
TOL = 2e-3  # Triton dots may run in TF32


def _inputs(lengths: list[int], seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    t, h, hv, dk, dv = sum(lengths), 2, 4, 64, 64
    x = {
        "q": torch.randn(1, t, h, dk, generator=gen),
        "k": torch.randn(1, t, h, dk, generator=gen),
        "v": torch.randn(1, t, hv, dv, generator=gen),
        "g": torch.nn.functional.logsigmoid(torch.rand(1, t, hv, generator=gen) * 4),
        "beta": torch.rand(1, t, hv, generator=gen).sigmoid(),
        "h0": torch.randn(len(lengths), hv, dk, dv, generator=gen),
        "cu": torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()]),
    }
    return {k: v.to(DEVICE) for k, v in x.items()}


def _triton() -> None:
    from vllm.triton_utils import HAS_TRITON

    if not HAS_TRITON:
        pytest.skip("Triton has no active driver here")


def _decode_agrees(kernel: Any, slots: list[int], seed: int) -> None:
    """One decode step of len(slots) sequences through ``kernel`` (vLLM's signature)
    against the portable recurrence: outputs and the state pool after."""
    from vllm_kunlun.ops.gdn import portable as gdn_portable

    x = _inputs([1] * len(slots), seed=seed)
    pool = torch.randn(len(slots) + 2, 4, 64, 64, device=DEVICE)
    indices = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
    ours = pool.clone()
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    o, _ = kernel(
        *args,
        scale=64**-0.5,
        initial_state=pool,
        inplace_final_state=True,
        cu_seqlens=x["cu"].to(torch.int32),
        ssm_state_indices=indices,
        use_qk_l2norm_in_kernel=True,
    )
    o_ref = gdn_portable.recurrent_gated_delta_rule(
        *args, 64**-0.5, ours, x["cu"], indices
    )
    torch.testing.assert_close(o.float(), o_ref, atol=TOL, rtol=TOL)
    torch.testing.assert_close(pool, ours, atol=TOL, rtol=TOL)


def test_vllms_triton_chunked_rule_matches_portable() -> None:
    _triton()
    from vllm.model_executor.layers.fla.ops import chunk_gated_delta_rule

    from vllm_kunlun.ops.gdn import portable as gdn_portable

    x = _inputs([1, 63, 130])
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    o, h = chunk_gated_delta_rule(
        *args,
        scale=64**-0.5,
        initial_state=x["h0"].clone(),
        output_final_state=True,
        cu_seqlens=x["cu"],
        use_qk_l2norm_in_kernel=True,
    )
    o_ref, h_ref = gdn_portable.chunk_gated_delta_rule(
        *args, 64**-0.5, x["h0"].clone(), x["cu"]
    )
    torch.testing.assert_close(o.float(), o_ref, atol=TOL, rtol=TOL)
    torch.testing.assert_close(h.float(), h_ref, atol=TOL, rtol=TOL)


def test_vllms_triton_recurrence_matches_portable_in_a_state_pool() -> None:
    _triton()
    from vllm.model_executor.layers.fla.ops import fused_recurrent_gated_delta_rule

    _decode_agrees(fused_recurrent_gated_delta_rule, [4, 0, 2], seed=1)


def test_vendor_decode_kernel_matches_portable(monkeypatch: pytest.MonkeyPatch) -> None:
    kunlun_ops = pytest.importorskip("kunlun_ops")
    if hasattr(kunlun_ops, "CALLS"):
        pytest.skip("this is the test fake of kunlun_ops, not the vendor library")
    from vllm.model_executor.models import qwen3_next

    from vllm_kunlun.ops.gdn import seam as gdn

    monkeypatch.setenv("VLLM_KUNLUN_GDN", "vendor")
    gdn.reset()
    route = gdn.dispatcher(
        "fused_recurrent_gated_delta_rule", qwen3_next.fused_recurrent_gated_delta_rule
    )
    _decode_agrees(route, [5, 1, 3, 0], seed=2)
    assert gdn.choose("fused_recurrent_gated_delta_rule", DEVICE).name == "vendor"


@pytest.mark.parametrize("kernels", ["auto", "portable"])
def test_hybrid_greedy_matches_transformers_on_cuda(
    kernels: str, tmp_path: Path
) -> None:
    model = str(
        write_tiny_model(tmp_path / "tiny35", TinyQwen3_5Spec(layout="composite"))
    )
    spec = {
        "backend": "vllm",
        "model": model,
        "llm": {**LLM_ARGS, "enforce_eager": True, "kv_cache_memory_bytes": 1 << 30},
        "jobs": GREEDY_JOBS,
        "hf_jobs": GREEDY_JOBS,
        "hf_cache": True,
    }
    env = {
        "FAKE_XMLIR_DEVICES": "1",  # one fake Kunlun device: vLLM picks KunlunPlatform
        "VLLM_LOGGING_LEVEL": "INFO",
        "VLLM_KUNLUN_GDN": kernels,
    }
    result = run_spec(spec, tmp_path, f"hybrid-cuda-{kernels}", env=env)
    (info,) = result["serving"]
    assert info["platform"] == "vllm_kunlun.platforms.kunlun.KunlunPlatform"
    for job in GREEDY_JOBS:
        name = job["name"]
        for got, want in zip(result["jobs"][name], result["hf"][name], strict=True):
            assert got["token_ids"] == want["token_ids"], (kernels, name, got["text"])
