"""The doctor's runner, renderings, JSON schema and exit code (no vLLM engine)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from vllm_kunlun.checks.finding import Context, Finding, run_checks
from vllm_kunlun.cli import main
from vllm_kunlun.doctor import checks as checks_module
from vllm_kunlun.doctor.report import (
    exit_code,
    json_schema,
    render_json,
    render_table,
)


def _ok(ctx: Context) -> Finding:
    return Finding("ok_check", "ok", "all good")


def _warn(ctx: Context) -> Finding:
    return Finding("warn_check", "warn", "watch out", "do this", {"n": 1})


def _fail(ctx: Context) -> Finding:
    return Finding(
        "fail_check", "fail", "broken", "fix it", {"arithmetic": ["1 + 1 = 2"]}
    )


def _crash(ctx: Context) -> Finding:
    raise KeyError("no such thing")


def _not_a_finding(ctx: Context) -> Finding:
    return "fine"  # type: ignore[return-value]


def test_crashing_check_is_a_failed_finding_not_a_crash() -> None:
    findings = run_checks(
        [("good", _ok), ("boom", _crash), ("bogus", _not_a_finding)], Context()
    )
    assert [f.check for f in findings] == ["good", "boom", "bogus"]
    assert [f.status for f in findings] == ["ok", "fail", "fail"]
    assert "KeyError" in findings[1].cause and "no such thing" in findings[1].cause
    assert "_crash" in findings[1].details["traceback"]
    assert "not a Finding" in findings[2].cause
    assert exit_code(findings) == 1


def test_exit_code_only_fails_on_fail() -> None:
    findings = run_checks([("a", _ok), ("b", _warn)], Context())
    assert exit_code(findings) == 0
    findings.append(Finding("c", "skip", "not here"))
    assert exit_code(findings) == 0


def test_json_output_validates_against_the_documented_schema() -> None:
    findings = run_checks(
        [("a", _ok), ("b", _warn), ("c", _fail), ("d", _crash)], Context()
    )
    doc = json.loads(render_json(findings))
    jsonschema.validate(doc, json_schema())
    assert doc["schema_version"] == 1
    assert doc["ok"] is False and doc["exit_code"] == 1
    assert doc["counts"] == {"ok": 1, "warn": 1, "fail": 2, "skip": 0}
    assert doc["findings"][1] == {
        "check": "b",
        "status": "warn",
        "cause": "watch out",
        "fix": "do this",
        "details": {"n": 1},
    }


def test_schema_rejects_what_it_should() -> None:
    schema = json_schema()
    good = json.loads(render_json([Finding("a", "ok", "fine")]))
    bad_status = json.loads(json.dumps(good))
    bad_status["findings"][0]["status"] = "error"
    missing_fix = json.loads(json.dumps(good))
    del missing_fix["findings"][0]["fix"]
    for doc in (bad_status, missing_fix):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, schema)


def test_table_is_compact_and_coloured_only_when_asked() -> None:
    findings = run_checks([("a", _ok), ("b", _warn), ("c", _fail)], Context())
    plain = render_table(findings)
    assert "\033[" not in plain
    lines = plain.splitlines()
    assert lines[0].startswith("OK    a")
    assert lines[1].startswith("WARN  b") and lines[2].strip() == "fix: do this"
    assert "1 + 1 = 2" in plain  # the arithmetic is shown
    assert lines[-1] == "3 checks: 1 failed, 1 warnings, 0 skipped"
    coloured = render_table(findings, colour=True)
    assert "\033[31mFAIL" in coloured and "\033[32mOK" in coloured


def test_cli_exit_code_and_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(checks_module, "CHECKS", [("a", _ok), ("c", _fail)])
    assert main(["doctor", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, json_schema())
    assert [f["status"] for f in doc["findings"]] == ["ok", "fail"]

    monkeypatch.setattr(checks_module, "CHECKS", [("a", _ok), ("b", _warn)])
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "WARN  b" in out and "\033[" not in out  # captured stdout is not a TTY


def test_cli_rejects_bad_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["doctor", "--gpu-memory-utilization", "1.5"])
    assert "not in (0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        # nan / inf crashed the budget; -5 advised utilization 2.20; 0 silently
        # meant "ask the device" (96 GiB); -1000 GiB of reserve gave "11.41".
        (["doctor", "--device-memory-gib", "nan"], "not a finite number"),
        (["doctor", "--device-memory-gib", "inf"], "not a finite number"),
        (["doctor", "--device-memory-gib", "-5"], "not a number > 0"),
        (["doctor", "--device-memory-gib", "0"], "not a number > 0"),
        (["doctor", "--reserve-gib", "-1000"], "not a number >= 0"),
        (["doctor", "--reserve-gib", "nan"], "not a finite number"),
        (["doctor", "--gpu-memory-utilization", "nan"], "not a finite number"),
        (["doctor", "--tensor-parallel-size", "0"], "out of range"),
        (["doctor", "--max-num-seqs", "1e400"], "not an integer"),
        (["doctor", "--max-num-seqs", str(10**400)], "out of range"),
        (["demo", "--max-tokens", "0"], "out of range"),
        (["demo", "--temperature", "-1"], "not a number >= 0"),
        (["demo", "--temperature", "nan"], "not a finite number"),
        (["demo", "--seed", "-3"], "out of range"),
        (["demo", "--max-model-len", "-512"], "out of range"),
        (["patch", "apply", "--lock-timeout", "nan"], "not a finite number"),
        (["patch", "apply", "--lock-timeout", "-1"], "not a number >= 0"),
    ],
)
def test_every_numeric_option_is_checked_at_parsing(
    capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    option = next(a for a in argv if a.startswith("--"))
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err and words in err, err


def test_cli_device_memory_is_used_as_given(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[Context] = []

    def record(ctx: Context) -> Finding:
        seen.append(ctx)
        return Finding("x", "ok", "fine")

    monkeypatch.setattr(checks_module, "CHECKS", [("x", record)])
    assert main(["doctor", "--device-memory-gib", "0.5", "--reserve-gib", "0"]) == 0
    assert seen[0].device_memory_bytes == 1 << 29 and seen[0].reserve_gib == 0.0


def test_every_check_is_documented() -> None:
    """docs/doctor.md and the schema name every check the doctor runs."""
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[3] / "docs" / "doctor.md").read_text()
    described = json_schema()["$defs"]["finding"]["properties"]["check"]["description"]
    for name, _ in checks_module.CHECKS:
        assert f"| `{name}` |" in docs, name
        assert name in described, name
