"""Doctor check 8: the sampling implementation and the on-device noise probe."""

from __future__ import annotations

import pytest
import torch

from vllm_kunlun.checks.finding import Context
from vllm_kunlun.doctor.sampler_path import (
    check_sampler_path,
    count_exponential,
    probe_device,
    run_probe,
)
from vllm_kunlun.ops.sampling import native_cpu as sampling_native


def test_kunlun_sampler_probe_passes_here() -> None:
    f = check_sampler_path(Context())
    assert f.status == "ok", f
    probe = f.details["probe"]
    assert probe["exponential_calls"] == 0 and probe["problems"] == []
    expected = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert probe["device"] == expected
    # On the CPU: the native kernel when the extension is built (the setup builds it).
    on_cpu = "native" if sampling_native.available()[0] else "portable"
    allowed = ("vendor", "portable") if expected != "cpu" else (on_cpu,)
    assert f.details["kernels"]["name"] in allowed
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


# ---- what the worker would run (VLLM_PLUGINS, the worker class) -----------------------

WORKER_PROBE = """
import json
from vllm_kunlun.checks.finding import Context
from vllm_kunlun.ops.sampling import native_cpu as sampling_native
from vllm_kunlun.doctor.sampler_path import check_sampler_path
f = check_sampler_path(Context())
print("FINDING " + json.dumps([f.status, f.cause, f.fix, f.details["worker_sampler"]]))
"""


def _probe(env: dict[str, str]) -> list:
    import json

    from tests.conftest import run_python

    proc = run_python(WORKER_PROBE, env={"FAKE_XMLIR_DEVICES": "8", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("FINDING "))
    return json.loads(line[len("FINDING ") :])


def test_the_workers_sampler_is_what_the_check_reports() -> None:
    """VLLM_PLUGINS=kunlun (no general plugin): the worker still prepares its process,
    so the model runner builds ours, and the check says which worker told it so."""
    status, cause, _, built = _probe({"VLLM_PLUGINS": "kunlun"})
    assert status in ("ok", "warn"), cause
    assert built == "KunlunTopKTopPSampler"
    assert "vllm_kunlun.platforms.worker.KunlunWorker prepares its process" in cause


def test_a_plugin_list_without_the_platform_fails_with_the_fix() -> None:
    """On a Kunlun host (8 fake devices) VLLM_PLUGINS that leaves out `kunlun` means
    vLLM's own sampler in every worker: a failure, not the old false OK."""
    status, cause, fix, built = _probe({"VLLM_PLUGINS": "kunlun_runtime_fixes"})
    assert status == "fail" and built is None
    assert "leaves out the platform plugin 'kunlun'" in cause
    assert "TopKTopPSampler.forward_native" in cause
    assert fix.startswith("export VLLM_PLUGINS=kunlun_runtime_fixes,kunlun ")
