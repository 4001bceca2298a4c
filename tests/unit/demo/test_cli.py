"""``vllm-kunlun demo``: the platform choice and what the report prints."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from vllm_kunlun.demo.cli import _print_report, run_demo_command
from vllm_kunlun.demo.run import DemoReport, Generation, choose_platform


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
        model_kind="a tiny model",
        engine_mode="multiprocessing",
        import_s=9.0,
        engine_start_s=3.25,
        generate_s=0.5,
        prompt_tokens=8,
        output_tokens=16,
        output_tokens_per_s=32.0,
        generations=[Generation("one two", " three four", [1, 2], [5, 6], 0)],
        serving=[
            {
                "platform": "vllm_kunlun.platforms.emulation.KunlunHostEmulationPlatform",
                "device_name": "emu",
                "attention_backends": ["CUSTOM (portable)"],
                "topk_topp_forward": "vllm_kunlun.ops.sampling.X.forward",
                "sampling_kernels": "portable (the logits are on the CPU)",
                "gdn_kernels": [
                    {"op": "chunk", "device": "cpu", "path": "portable", "reason": "r"},
                    {"op": "conv", "device": "cpu", "path": "portable", "reason": "r"},
                    {"op": "rec", "device": "xpu", "path": "vendor", "reason": "v"},
                ],
                "linear_kernels": ["vllm_kunlun.Int8Kernel"],
                "int8_kernels": "portable (emulation)",
            }
        ],
    )
    _print_report(report)
    out = capsys.readouterr().out
    # One line per layer kind; GDN ops grouped by the path and device that served them.
    assert "GDN kernels     : portable on cpu: chunk, conv (r)\n" in out
    assert "GDN kernels     : vendor on xpu: rec (v)\n" in out
    assert "int8 kernels    : portable (emulation)\n" in out
    assert "(a tiny model)" in out
    assert "HOST EMULATION" in out
    assert "started in 3.25 s" in out
    assert "KunlunHostEmulationPlatform" in out
    assert "CUSTOM (portable)" in out
    assert "vllm_kunlun.ops.sampling.X.forward" in out
    assert "portable (the logits are on the CPU)" in out
    assert "> one two\n  three four" in out
    assert "32.0 output tokens/s" in out


def _report() -> DemoReport:
    return DemoReport(
        platform_choice="no Kunlun device detected (x)",
        emulation=True,
        model="/cache/tiny",
        model_kind="a tiny model",
        engine_mode="in-process",
        import_s=1.0,
        engine_start_s=2.0,
        generate_s=0.5,
        prompt_tokens=2,
        output_tokens=2,
        output_tokens_per_s=4.0,
        generations=[Generation("one two", " three four", [1, 2], [5, 6], 0)],
    )


def _demo_args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    from vllm_kunlun.cli import build_parser

    return build_parser().parse_args(
        ["demo", "--log-file", str(tmp_path / "demo.log"), *extra]
    )


def test_text_mode_prints_the_report_and_logs_to_the_named_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def engine(**kwargs: object) -> DemoReport:
        print("INFO 12-01 00:00:00 [core.py:1] an engine log line")
        return _report()

    monkeypatch.setattr("vllm_kunlun.demo.run.run_demo", engine)
    assert run_demo_command(_demo_args(tmp_path)) == 0
    out = capsys.readouterr().out
    assert f"vLLM's log: {tmp_path / 'demo.log'} (-v shows it here)" in out
    assert "> one two\n  three four" in out
    assert "an engine log line" not in out
    assert "an engine log line" in (tmp_path / "demo.log").read_text()


def test_a_failed_run_shows_the_end_of_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def engine(**kwargs: object) -> DemoReport:
        print("ERROR the reason the engine died")
        raise RuntimeError("Engine core initialization failed")

    monkeypatch.setattr("vllm_kunlun.demo.run.run_demo", engine)
    with pytest.raises(RuntimeError, match="initialization failed"):
        run_demo_command(_demo_args(tmp_path))
    captured = capsys.readouterr()
    assert "the reason the engine died" not in captured.out
    assert "vllm-kunlun demo failed; the end of vLLM's log" in captured.err
    assert "ERROR the reason the engine died" in captured.err


def test_verbose_leaves_the_log_where_vllm_puts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def engine(**kwargs: object) -> DemoReport:
        print("INFO an engine log line")
        return _report()

    monkeypatch.setattr("vllm_kunlun.demo.run.run_demo", engine)
    assert run_demo_command(_demo_args(tmp_path, "-v")) == 0
    assert "INFO an engine log line" in capsys.readouterr().out
    assert not (tmp_path / "demo.log").exists()


def test_named_tiny_models_are_built_once_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from vllm_kunlun.demo.run import DEFAULT_MODEL, TINY_MODELS, tiny_model_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert DEFAULT_MODEL == "qwen3_5" and set(TINY_MODELS) == {"qwen3_5", "qwen3"}
    default = tiny_model_dir("qwen3_5")
    config = json.loads((default / "config.json").read_text())
    # The log's model in miniature: the composite, W8A8 with the vision tower in float.
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert config["quantization_config"]["format"] == "int-quantized"
    assert "re:.*visual.*" in config["quantization_config"]["ignore"]
    weights = default / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert tiny_model_dir("qwen3_5") == default  # complete: not rewritten
    assert weights.stat().st_mtime_ns == stamp
    qwen3 = tiny_model_dir("qwen3")
    assert qwen3 != default
    assert json.loads((qwen3 / "config.json").read_text())["architectures"] == [
        "Qwen3ForCausalLM"
    ]
    # An interrupted build (no marker) is rebuilt, not served half-written.
    (default / "vllm-kunlun-tiny.json").unlink()
    assert tiny_model_dir("qwen3_5") == default
    assert (default / "vllm-kunlun-tiny.json").is_file()
    with pytest.raises(ValueError, match="known: qwen3_5, qwen3"):
        tiny_model_dir("qwen2")
