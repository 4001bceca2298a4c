"""``vllm-kunlun accuracy`` usage errors: exit 2 with a line naming the cause, never a
traceback, and no read without bound. Each case below ended in a traceback with exit 1
("wrong deployment") or read forever before."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from vllm_kunlun.accuracy import cli as accuracy_cli
from vllm_kunlun.cli import main


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(["accuracy", *argv])
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize("url", ["not a url", "ftp://host/x", "http://", "http://h:x"])
def test_a_url_that_is_not_a_server_is_a_usage_error(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text = _run(["--url", url, "--model", str(tmp_path)], capsys)
    assert code == 2
    assert "Traceback" not in text
    assert "http(s) URL" in text or "not a URL" in text


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"\xff\xfe\x00binary\x80\x81", "not UTF-8 text"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'["a", 1]', "list of strings"),
        (b"x" * (accuracy_cli.MAX_PROMPTS_BYTES + 10), "larger than 1 MiB"),
    ],
    ids=["binary", "deep", "not_strings", "huge"],
)
def test_bad_prompt_files_are_usage_errors(
    content: bytes, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts"
    prompts.write_bytes(content)
    code, text = _run(
        [
            "--url",
            "http://127.0.0.1:9",
            "--model",
            str(tmp_path),
            "--prompts",
            str(prompts),
            "--json",
        ],
        capsys,
    )
    assert code == 2
    doc = json.loads(text.strip().splitlines()[-1])
    assert doc["exit_code"] == 2 and words in doc["error"]


def test_an_endless_prompt_file_is_read_with_a_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """/dev/zero never ends: the read stops at the bound (a thread, so that a
    regression fails the test instead of hanging it)."""
    result: list[BaseException | list[str]] = []

    def read() -> None:
        try:
            result.append(accuracy_cli.read_prompts("/dev/zero"))
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert result, "read_prompts('/dev/zero') did not return within 30 s"
    assert isinstance(result[0], accuracy_cli.UsageError)
    assert "larger than 1 MiB" in str(result[0])


def test_a_checkpoint_transformers_cannot_load_is_a_reference_error(
    tmp_path: Path,
) -> None:
    from vllm_kunlun.accuracy import reference

    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "no_such_family", "architectures": ["NoSuchLM"]})
    )
    with pytest.raises(reference.ReferenceUnavailable) as refused:
        reference.Reference(str(tmp_path), "float32")
    assert "cannot load it" in str(refused.value)
    assert str(tmp_path) in str(refused.value)
