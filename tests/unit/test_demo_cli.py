"""``vllm-kunlun demo``: the platform choice and what the report prints."""

from __future__ import annotations

import pytest

from vllm_kunlun.demo import DemoReport, Generation, choose_platform
from vllm_kunlun.demo_cli import _print_report


def test_emulation_without_a_kunlun_device(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("VLLM_KUNLUN_HOST_EMULATION", "VLLM_KUNLUN_FORCE_PLATFORM"):
        monkeypatch.delenv(var, raising=False)
    choice = choose_platform()  # no torch_xmlir on this path
    assert choice.emulation
    assert "no Kunlun device detected" in choice.reason


def test_kunlun_when_devices_are_present(
    monkeypatch: pytest.MonkeyPatch, fake_vendor_path: object
) -> None:
    monkeypatch.delenv("VLLM_KUNLUN_HOST_EMULATION", raising=False)
    monkeypatch.setenv("FAKE_XMLIR_DEVICES", "2")
    choice = choose_platform()
    assert not choice.emulation
    assert choice.reason.startswith("2 Kunlun device(s)")


def test_explicit_emulation_wins_over_devices(
    monkeypatch: pytest.MonkeyPatch, fake_vendor_path: object
) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_HOST_EMULATION", "1")
    assert choose_platform().emulation


def test_report_names_what_served(capsys: pytest.CaptureFixture) -> None:
    report = DemoReport(
        platform_choice="no Kunlun device detected (x)",
        emulation=True,
        model="/cache/tiny",
        engine_mode="multiprocessing",
        import_s=9.0,
        engine_start_s=3.25,
        generate_s=0.5,
        prompt_tokens=8,
        output_tokens=16,
        output_tokens_per_s=32.0,
        generations=[Generation("one two", " three four", [5, 6], 0)],
        serving=[
            {
                "platform": "vllm_kunlun.emulation.KunlunHostEmulationPlatform",
                "device_name": "emu",
                "attention_backends": ["CUSTOM (portable)"],
                "topk_topp_forward": "vllm_kunlun.sample.X.forward",
                "sampling_kernels": "portable (the logits are on the CPU)",
            }
        ],
    )
    _print_report(report)
    out = capsys.readouterr().out
    assert "HOST EMULATION" in out
    assert "started in 3.25 s" in out
    assert "KunlunHostEmulationPlatform" in out
    assert "CUSTOM (portable)" in out
    assert "vllm_kunlun.sample.X.forward" in out
    assert "portable (the logits are on the CPU)" in out
    assert "> one two\n  three four" in out
    assert "32.0 output tokens/s" in out
