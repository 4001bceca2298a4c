"""``--json`` owns stdout; the demo's text mode keeps vLLM's log in a file.

Each case runs in a fresh interpreter (real file descriptors, as a user's shell gives
them), without vLLM: a handler on the ``vllm`` logger stands in for vLLM's, and a child
process for an engine process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import REPO

PRELUDE = """
import json, logging, os, subprocess, sys
from vllm_kunlun.cli import streams

def noisy():
    # vLLM's handler, configured before the run (vLLM imported earlier)
    logging.getLogger("vllm").info("INFO from vLLM's logger")
    os.write(1, b"C-level write to fd 1\\n")
    subprocess.run([sys.executable, "-c", "print('engine process stdout')"], check=True)
    print("stream env:", os.environ.get("VLLM_LOGGING_STREAM"), file=sys.stderr)

handler = logging.StreamHandler(sys.stdout)
logging.getLogger("vllm").addHandler(handler)
logging.getLogger("vllm").setLevel(logging.INFO)
"""


def _run(body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_json_stdout_carries_only_what_the_command_prints() -> None:
    proc = _run(
        """
        with streams.json_stdout():
            noisy()
            print(json.dumps({"ok": True}))
        logging.getLogger("vllm").info("after the run")
        """
    )
    assert proc.returncode == 0, proc.stderr
    out, _, after = proc.stdout.partition("}\n")
    assert json.loads(out + "}") == {"ok": True}
    assert after == "after the run\n"  # vLLM's handler is back on stdout
    for line in (
        "INFO from vLLM's logger",
        "C-level write to fd 1",
        "engine process stdout",
        "stream env: ext://sys.stderr",
    ):
        assert line in proc.stderr


def test_output_to_file_keeps_the_log_and_the_report_apart(tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    proc = _run(
        f"""
        print("starting", flush=True)
        with streams.output_to_file({str(log)!r}):
            noisy()
        print("the report")
        logging.getLogger("vllm").info("engine shutdown line")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "starting\nthe report\n"
    assert proc.stderr == ""
    text = log.read_text()
    for line in (
        "INFO from vLLM's logger",
        "C-level write to fd 1",
        "engine process stdout",
        "engine shutdown line",
    ):
        assert line in text
