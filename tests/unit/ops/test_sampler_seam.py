"""The sampling kernel seam (vllm_kunlun/ops/sampling/seam.py) and its vendor call.

The vendor path runs against tests/fakes/kunlun_ops, which has flashinfer's sampling
signatures, checks its inputs like the real kernel, samples with flashinfer's semantics
and records each call with its output.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.unit.sampler_reference import ALPHA, chi_square_pvalue, reference
from vllm_kunlun.ops.contract import VENDOR_CONTRACT
from vllm_kunlun.ops.sampling import seam as sampling

CUDA = torch.device("cuda", 0)  # only used as a label: no tensor is put there
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def on_kunlun(kunlun_platform: object) -> None:
    """The seam follows the active platform's policy: Kunlun's unless a test says."""


@pytest.fixture
def fake_ops(fake_vendor_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("VLLM_KUNLUN_SAMPLER", raising=False)
    import kunlun_ops

    kunlun_ops.reset()
    return kunlun_ops


@pytest.fixture
def no_vendor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_KUNLUN_SAMPLER", raising=False)
    monkeypatch.setitem(sys.modules, "kunlun_ops", None)  # import fails


def test_auto_uses_the_vendor_kernel_on_a_device(fake_ops: Any) -> None:
    kernels = sampling.select_kernels(CUDA)
    assert kernels.name == "vendor"
    assert kernels.vendor_fn is fake_ops.top_k_top_p_sampling_from_probs
    assert "top_k_top_p_sampling_from_probs is available" in kernels.reason


@pytest.mark.skipif(
    not sampling.native.available()[0], reason="native extension not built"
)
def test_auto_uses_the_native_kernel_for_cpu_tensors(fake_ops: Any) -> None:
    kernels = sampling.select_kernels(CPU)
    assert (kernels.name, kernels.reason) == (
        "native",
        "the logits are on the CPU; torch.ops.vllm_kunlun.sample_rows loaded "
        f"({sampling.native.isa()} kernels)",
    )
    logits = torch.randn(300, 64)
    tokens = kernels.sample_logits(logits, torch.full((300,), 3), None)
    top3 = logits.topk(3, dim=-1).indices
    assert (top3 == tokens.unsqueeze(1)).any(-1).all()
    assert not fake_ops.CALLS


def test_auto_without_the_native_kernel_uses_portable_and_says_why(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        sampling.native, "available", lambda: (False, "vllm_kunlun._native missing")
    )
    kernels = sampling.select_kernels(CPU)
    assert (kernels.name, kernels.reason) == (
        "portable",
        "the logits are on the CPU; vllm_kunlun._native missing",
    )


@pytest.mark.skipif(
    not sampling.native.available()[0], reason="native extension not built"
)
def test_auto_keeps_portable_torch_where_only_the_scalar_kernels_run(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without AVX2 the C++ kernels are slower than portable torch: auto says so and
    uses torch; VLLM_KUNLUN_SAMPLER=native still gets them."""
    sampling.native.isa("scalar")
    try:
        kernels = sampling.select_kernels(CPU)
        assert kernels.name == "portable"
        assert "(scalar kernels), but this CPU has no AVX2/FMA" in kernels.reason
        monkeypatch.setenv("VLLM_KUNLUN_SAMPLER", "native")
        assert sampling.select_kernels(CPU).name == "native"
    finally:
        sampling.native.isa("auto")


def test_native_mode_fails_clearly_off_the_cpu_or_without_the_extension(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_SAMPLER", "native")
    with pytest.raises(RuntimeError, match="runs on the CPU, but the logits are on"):
        sampling.select_kernels(CUDA)
    monkeypatch.setattr(
        sampling.native, "available", lambda: (False, "vllm_kunlun._native missing")
    )
    with pytest.raises(RuntimeError, match=r"native, but vllm_kunlun\._native missing"):
        sampling.select_kernels(CPU)


def test_emulated_vendor_paths_keep_the_vendor_kernel_on_the_cpu(
    fake_ops: Any, emulation_platform: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_KUNLUN_EMULATION_VENDOR", raising=False)
    kernels = sampling.select_kernels(CPU)
    assert kernels.name in ("native", "portable")
    assert kernels.reason.startswith("host emulation takes the portable paths")
    monkeypatch.setenv("VLLM_KUNLUN_EMULATION_VENDOR", "1")
    assert sampling.select_kernels(CPU).name == "vendor"


def test_another_vllm_platform_takes_no_vendor_kernel(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA host's own platform (kernel developers' GPU checks) never gets the vendor
    kernel, even where a kunlun_ops module imports."""
    from vllm.platforms.cpu import CpuPlatform

    from tests.conftest import serve_platform

    serve_platform(monkeypatch, CpuPlatform())
    kernels = sampling.select_kernels(CUDA)
    assert kernels.name == "portable"
    assert kernels.reason == "the active vLLM platform is not a vllm-kunlun platform"


def test_auto_without_vendor_library_says_why(no_vendor: None) -> None:
    kernels = sampling.select_kernels(CUDA)
    assert kernels.name == "portable" and kernels.vendor_fn is None
    assert kernels.reason.startswith("kunlun_ops is not importable")


def test_vendor_library_without_the_kernel_says_why(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(fake_ops, "top_k_top_p_sampling_from_probs")
    kernels = sampling.select_kernels(CUDA)
    assert kernels.name == "portable"
    assert kernels.reason == (
        "kunlun_ops (0.1.58) has no top_k_top_p_sampling_from_probs (the validated "
        "kunlun_ops 0.1.58 has it)"
    )


def test_vendor_mode_without_vendor_library_fails_clearly(
    no_vendor: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_SAMPLER", "vendor")
    with pytest.raises(RuntimeError, match="VLLM_KUNLUN_SAMPLER=auto"):
        sampling.select_kernels(CUDA)


def test_portable_mode_ignores_the_vendor_library_and_the_native_kernel(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_SAMPLER", "portable")
    assert sampling.select_kernels(CUDA).name == "portable"
    assert sampling.select_kernels(CPU).name == "portable"


def test_bad_mode_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_SAMPLER", "flashinfer")
    with pytest.raises(ValueError, match="auto, vendor, native, portable"):
        sampling.select_kernels(CPU)


def _spy(fake_ops: Any, monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple, dict]]:
    calls: list[tuple[tuple, dict]] = []
    real = fake_ops.top_k_top_p_sampling_from_probs

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(fake_ops, "top_k_top_p_sampling_from_probs", spy)
    return calls


def test_unfiltered_batch_calls_the_kernel_with_fill_in_values(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No top-k / top-p: still the kernel, with top_k = vocab and top_p = 1.0."""
    calls = _spy(fake_ops, monkeypatch)
    monkeypatch.setenv("VLLM_KUNLUN_SAMPLER", "vendor")
    kernels = sampling.select_kernels(CPU)
    # Flat logits: a greedy answer (argmax) matches the kernel's draw in all four rows
    # with probability ~(1/50)^4, so passing the draw on is what is tested below.
    wide = torch.randn(4, 2 * 50, generator=torch.Generator().manual_seed(5)) * 0.1
    logits = wide[:, ::2]  # non-contiguous, as vLLM's logits can be
    tokens = kernels.sample_logits(logits, None, None)
    assert len(calls) == 1 and len(fake_ops.CALLS) == 1
    args, kwargs = calls[0]
    assert len(args) == 1  # probs positionally, everything else by keyword
    assert set(kwargs) == set(
        VENDOR_CONTRACT["kunlun_ops"]["top_k_top_p_sampling_from_probs"]
    )
    call = fake_ops.CALLS[0]
    probs = call.tensors["probs"]
    assert probs.dtype == torch.float32 and call.contiguous["probs"]
    assert torch.allclose(probs, logits.softmax(-1))
    assert call.tensors["top_k"].dtype == torch.int32 and call.contiguous["top_k"]
    assert call.tensors["top_k"].tolist() == [50] * 4
    assert call.tensors["top_p"].dtype == torch.float32 and call.contiguous["top_p"]
    assert call.tensors["top_p"].tolist() == [1.0] * 4
    assert call.scalars["deterministic"] is True
    assert call.scalars["filter_apply_order"] == "top_k_first"  # the default
    assert torch.equal(tokens, call.out)  # the kernel's draw, not a greedy answer


def test_filters_reach_the_kernel_as_int32_and_float32(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_SAMPLER", "vendor")
    kernels = sampling.select_kernels(CPU)
    k = torch.tensor([1, 7, 50], dtype=torch.int64)
    p = torch.tensor([0.5, 1.0, 0.9], dtype=torch.float64)
    kernels.sample_logits(torch.randn(3, 50), k, None)
    kernels.sample_logits(torch.randn(3, 50), None, p)
    kernels.sample_logits(torch.randn(3, 50), k, p)
    top_k = [c.tensors["top_k"] for c in fake_ops.CALLS]
    top_p = [c.tensors["top_p"] for c in fake_ops.CALLS]
    assert all(t.dtype == torch.int32 for t in top_k)
    assert all(t.dtype == torch.float32 for t in top_p)
    assert [t.tolist() for t in top_k] == [[1, 7, 50], [50, 50, 50], [1, 7, 50]]
    assert top_p[0].tolist() == [1.0, 1.0, 1.0]
    assert torch.allclose(top_p[1], p.float()) and torch.allclose(top_p[2], p.float())


def test_empty_batch_does_not_call_the_kernel(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_SAMPLER", "vendor")
    tokens = sampling.select_kernels(CPU).sample_logits(torch.randn(0, 9), None, None)
    assert tokens.shape == (0,) and not fake_ops.CALLS


def test_portable_kernels_sample_from_the_filtered_set() -> None:
    kernels = sampling.SamplingKernels("portable", "test")
    logits = torch.randn(500, 64)
    k = torch.full((500,), 3)
    tokens = kernels.sample_logits(logits.clone(), k, None, inplace=True)
    top3 = logits.topk(3, dim=-1).indices
    assert (top3 == tokens.unsqueeze(1)).any(-1).all()


def test_every_vendor_call_is_declared_in_the_contract() -> None:
    declared = VENDOR_CONTRACT["kunlun_ops"]
    assert sampling.VENDOR_MODULE == "kunlun_ops"
    assert declared[sampling.VENDOR_FUNCTION] == ("top_k", "top_p", "deterministic")


@pytest.mark.parametrize(("k", "p"), [(5, None), (None, 0.6), (8, 0.7)])
def test_vendor_path_draws_follow_the_filtered_distribution(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch, k: int | None, p: float | None
) -> None:
    """Through the fake (flashinfer's semantics: it really samples), the seam's tokens
    are the kernel's draws from top-k / top-p of softmax(logits): none outside the kept
    set, frequencies by Pearson's chi-square (fixed seeds, fails at p < ALPHA)."""
    monkeypatch.setenv("VLLM_KUNLUN_SAMPLER", "vendor")
    kernels = sampling.select_kernels(CPU)
    n = 4000
    # Kept sets of 5, 7 and 4 tokens (top mass 0.27: no filter keeps only the mode).
    row = torch.randn(40, generator=torch.Generator().manual_seed(11))
    top_k = None if k is None else torch.full((n,), k)
    top_p = None if p is None else torch.full((n,), p)
    torch.manual_seed(12)  # the fake draws with the global RNG
    tokens = kernels.sample_logits(row.expand(n, -1), top_k, top_p)
    (call,) = fake_ops.CALLS
    assert torch.equal(tokens, call.out)
    assert chi_square_pvalue(tokens.long().numpy(), reference(row, k, p)) > ALPHA
