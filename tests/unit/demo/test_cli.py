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


def _engine_dies(**kwargs: object) -> DemoReport:
    import sys

    from vllm.v1.engine.exceptions import EngineDeadError

    # vLLM's log line (on stderr under --json, in the log file in text mode)
    print("ERROR Engine core proc EngineCore_DP0 died unexpectedly", file=sys.stderr)
    try:
        raise EngineDeadError(suppress_context=True)
    except EngineDeadError as dead:  # what LLM's callers see: vLLM wraps it at times
        raise RuntimeError("generation failed") from dead


def test_a_dead_engine_ends_the_demo_with_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr("vllm_kunlun.demo.run.run_demo", _engine_dies)
    assert run_demo_command(_demo_args(tmp_path)) == 1
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert "engine core process died (EngineDeadError)" in line
    assert f"vLLM's log ({tmp_path / 'demo.log'}) names the process" in line
    assert "out-of-memory killer" in line and "--max-model-len" in line
    assert "> one two" not in captured.out and "Traceback" not in captured.err
    assert "died unexpectedly" in (tmp_path / "demo.log").read_text()


def test_a_dead_engine_under_json_prints_a_json_error_on_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import json

    monkeypatch.setattr("vllm_kunlun.demo.run.run_demo", _engine_dies)
    out_file = tmp_path / "report.json"
    args = _demo_args(tmp_path, "--json", "--json-out", str(out_file))
    assert run_demo_command(args) == 1
    captured = capsys.readouterr()
    error = json.loads(captured.out)  # the only thing on stdout
    assert error["exit_code"] == 1 and error["cause"] == "engine core died"
    assert "engine core process died" in error["error"]
    assert "vLLM's log above names the process" in error["error"]
    assert json.loads(out_file.read_text()) == error
    assert error["error"] in captured.err


def test_other_errors_still_raise_under_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def engine(**kwargs: object) -> DemoReport:
        raise ValueError("not an engine death")

    monkeypatch.setattr("vllm_kunlun.demo.run.run_demo", engine)
    with pytest.raises(ValueError, match="not an engine death"):
        run_demo_command(_demo_args(tmp_path, "--json"))


def test_a_cached_model_rebuilt_is_said_on_the_terminal_in_text_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from vllm_kunlun.demo.tiny_model import ensure_tiny_model

    cached = ensure_tiny_model(tmp_path / "tiny")
    weights = cached / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # a truncated copy
    capsys.readouterr()

    def engine(**kwargs: object) -> DemoReport:
        ensure_tiny_model(cached)  # what run_demo does for a named tiny model
        return _report()

    monkeypatch.setattr("vllm_kunlun.demo.run.run_demo", engine)
    assert run_demo_command(_demo_args(tmp_path)) == 0
    err = capsys.readouterr().err
    assert f"the cached tiny model in {cached} does not load" in err
    assert "truncated" in err and "rebuilding it" in err
    # Once: the terminal handler is gone after the run.
    weights.write_bytes(weights.read_bytes()[:-100])
    ensure_tiny_model(cached)
    assert "rebuilding it" not in capsys.readouterr().err
