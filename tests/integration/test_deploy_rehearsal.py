"""docs/deploy.md's rehearsal, run as written: the log's model in miniature (the tiny
Qwen3.5 composite, W8A8-INT8 text linears) built, checked by the doctor, served by
``vllm serve`` in host emulation, and put to the accuracy check.

Each command of the section's first ``bash`` block runs in order, as a user types it,
with two substitutions only: the ``/tmp/...`` paths move under pytest's temporary
directory and the server gets a free port (the accuracy line's ``--url`` follows it).
A line's expected exit code is its ``# exit N`` comment (0 without one). What the
server answers is judged against the same-quantization float64 reference of
``w8a8_reference.py`` (transformers' Qwen3.5 on the int8 weights x scales), greedy
token for token. The section's second block (the float tiny model's server and
accuracy check) is test_serve.py's server, checked there.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import REPO, child_env
from tests.docs_blocks import ShellStep, rehearsal_blocks
from tests.integration.w8a8_reference import (
    assert_greedy_matches,
    float64_reference,
    greedy,
    teacher_forced,
)
from vllm_kunlun.demo.server_process import start_server

pytestmark = pytest.mark.slow

PROMPTS = ["the quick brown fox jumps over the lazy dog", "one two three four five"]
TOKENS = 8
_EXIT = re.compile(r"#\s*exit (\d+)")


def expected_exit(step: ShellStep) -> int:
    m = _EXIT.search(step.line)
    return int(m.group(1)) if m else 0


def _moved(argv: list[str], tmp: Path) -> list[str]:
    return [
        str(tmp / w.removeprefix("/tmp/")) if w.startswith("/tmp/") else w for w in argv
    ]


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Every step's exit code and output, and the server's greedy answers."""
    tmp = tmp_path_factory.mktemp("rehearsal")
    steps = rehearsal_blocks()[0]
    done: list[dict[str, Any]] = []
    server = None
    try:
        for step in steps:
            argv = _moved(step.argv, tmp)
            if argv[:2] == ["vllm", "serve"]:
                env = child_env({**step.env, "VLLM_LOGGING_LEVEL": "INFO"}, fakes=False)
                server = start_server(argv[2], argv[3:], env, log_dir=tmp)
                name = argv[argv.index("--served-model-name") + 1]
                client = openai.OpenAI(
                    base_url=f"{server.url}/v1",
                    api_key="unused",
                    timeout=120,
                    max_retries=0,
                )
                answers = [
                    client.completions.create(
                        model=name,
                        prompt=p,
                        max_tokens=TOKENS,
                        temperature=0.0,
                        # a fixed length: the tiny vocabulary holds EOS like any token
                        extra_body={"return_token_ids": True, "ignore_eos": True},
                    )
                    for p in PROMPTS
                ]
                done.append(
                    {
                        "step": step,
                        "argv": argv,
                        "returncode": 0,
                        "answers": [a.model_dump() for a in answers],
                    }
                )
                continue
            assert argv[0] == "vllm-kunlun", step.line  # nothing else is documented
            if argv[1] == "accuracy":
                assert server is not None, "accuracy before the server"
                argv[argv.index("--url") + 1] = server.url
            proc = subprocess.run(
                [sys.executable, "-m", "vllm_kunlun.cli", *argv[1:]],
                env=child_env(step.env, fakes=False),
                capture_output=True,
                text=True,
                timeout=600,
                cwd=REPO,
            )
            done.append(
                {
                    "step": step,
                    "argv": argv,
                    "returncode": proc.returncode,
                    "stdout": proc.stdout,
                    "stderr": proc.stderr,
                }
            )
        yield {"steps": done, "model": str(tmp / "tiny-log")}
    finally:
        if server is not None:
            server.stop(timeout=30)


def _step(rehearsal: dict[str, Any], program: str) -> dict[str, Any]:
    (found,) = [s for s in rehearsal["steps"] if s["argv"][1] == program]
    return found


def test_every_documented_command_exits_as_documented(rehearsal: dict) -> None:
    assert [s["argv"][1] for s in rehearsal["steps"]] == [
        "tiny-model",
        "doctor",
        "serve",
        "accuracy",
    ]
    for s in rehearsal["steps"]:
        want = expected_exit(s["step"])
        assert s["returncode"] == want, (
            s["step"].line,
            s.get("stdout", "")[-3000:],
            s.get("stderr", "")[-3000:],
        )


def test_the_doctor_passes_the_miniature_with_the_logs_settings(
    rehearsal: dict,
) -> None:
    doctor = _step(rehearsal, "doctor")
    assert "--gpu-memory-utilization" in doctor["argv"]
    assert re.search(r"^OK +kv_budget ", doctor["stdout"], re.M), doctor["stdout"]
    assert re.search(r"^OK +model_path ", doctor["stdout"], re.M), doctor["stdout"]


def test_the_server_answers_what_the_same_quantization_reference_computes(
    rehearsal: dict,
) -> None:
    answers = _step(rehearsal, "serve")["answers"]
    ref = float64_reference(rehearsal["model"])
    rows = []
    for a in answers:
        (choice,) = a["choices"]
        prompt, tokens = choice["prompt_token_ids"], choice["token_ids"]
        assert len(tokens) == TOKENS
        rows.append(
            (
                {"token_ids": tokens},
                greedy(ref, prompt, TOKENS),
                teacher_forced(ref, prompt, tokens),
            )
        )
    assert_greedy_matches(rows)
    for _, want, _ in rows:
        assert len(set(want)) > 2, want  # not a degenerate reference


def test_the_accuracy_check_refuses_the_w8a8_composite_naming_why(
    rehearsal: dict,
) -> None:
    acc = _step(rehearsal, "accuracy")
    assert "W8A8 composite" in acc["stderr"], acc["stderr"][-2000:]
    assert "no reference is better than a wrong one" in acc["stderr"]
