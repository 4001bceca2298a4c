"""Doctor check 8: the sampling implementation and the on-device noise probe."""

from __future__ import annotations

import pytest
import torch

from vllm_kunlun.doctor.finding import Context
from vllm_kunlun.doctor.sampler_path import (
    check_sampler_path,
    count_exponential,
    probe_device,
    run_probe,
)


def test_kunlun_sampler_probe_passes_here() -> None:
    f = check_sampler_path(Context())
    assert f.status == "ok", f
    probe = f.details["probe"]
    assert probe["exponential_calls"] == 0 and probe["problems"] == []
    expected = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert probe["device"] == expected
    assert f.details["kernels"]["name"] in ("vendor", "portable")
    assert f.details["patches"]["kunlun_topk_topp_sampler"] == "applies"
    if expected == "cpu":
        assert "CPU probe" in f.cause  # it says so


def test_probe_catches_vllms_exponential_sampler() -> None:
    """vLLM's own TopKTopPSampler (forward_native) is the log's decode-stall path."""
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    device, note = probe_device()
    result = run_probe(TopKTopPSampler(), device, note)
    assert result.exponential_calls > 0
    assert any("Tensor.exponential_ called" in p for p in result.problems)


def test_probe_catches_noise_off_the_device() -> None:
    class HostTokens:
        def __call__(self, logits, generators, k, p):  # type: ignore[no-untyped-def]
            return torch.zeros(logits.shape[0], dtype=torch.long, device="meta"), None

    result = run_probe(HostTokens(), torch.device("cpu"), "cpu")
    assert any("tokens (no filters) on meta, not cpu" in p for p in result.problems)


def test_exponential_counter_is_removed_after_the_probe() -> None:
    original = torch.Tensor.exponential_
    with count_exponential() as calls:
        torch.empty(4).exponential_()
    assert calls == [1]
    assert torch.Tensor.exponential_ is original


def test_vendor_mode_without_the_vendor_library_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_SAMPLER", "vendor")
    monkeypatch.setitem(__import__("sys").modules, "kunlun_ops", None)  # not importable
    f = check_sampler_path(Context())
    assert f.status == "fail"
    assert f.cause.startswith(
        "VLLM_KUNLUN_SAMPLER=vendor, but kunlun_ops is not importable"
    )
    assert "VLLM_KUNLUN_SAMPLER=auto" in f.fix
