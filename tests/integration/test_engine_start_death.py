"""``vllm-kunlun demo`` whose engine core is killed right after its startup handshake,
before the client binds its input socket (the engine's queued first message dies with
it): the demo ends within seconds with the JSON error of a dead engine, and the log
names the process and SIGKILL. Without ``client_engine_start_death`` vLLM's client
would poll ``VLLM_ENGINE_READY_TIMEOUT_S`` (600 s; 120 here, so a regression fails with
vLLM's TimeoutError instead of hanging the suite).

The kill is a hook in the demo's process: the patch's ``watch`` (called once the
handshake is over, before the client binds) kills the engine core first. One engine
start (tiny Qwen3, host emulation); then the same kill under ``vllm serve`` (the
API server's asynchronous client), which must exit with vLLM's ``EngineDeadError``
within seconds: a second engine start."""

from __future__ import annotations

import json
import re
import socket
import sys
import time
from pathlib import Path

from tests.conftest import child_env, run_bounded

HOOKED_DEMO = """
import os, signal, sys, time
from vllm_kunlun.guards import engine_start_death as esd

real_watch = esd.watch

def watch(launched, *args, **kwargs):
    for proc in launched[0].processes:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        print(f"TEST-HOOK killed {proc.name} at {time.time()}", file=sys.stderr)
    sys.stderr.flush()
    return real_watch(launched, *args, **kwargs)

esd.watch = watch
"""
DEMO_MAIN = """
from vllm_kunlun.cli import main
sys.exit(main(sys.argv[1:]))
"""
SERVE_MAIN = """
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", *sys.argv[1:]]
sys.exit(main())
"""


def _env(tmp_path: Path) -> dict[str, str]:
    return child_env(
        {
            "XDG_CACHE_HOME": str(tmp_path / "xdg"),
            "VLLM_KUNLUN_HOST_EMULATION": "1",
            "VLLM_LOGGING_LEVEL": "INFO",
            "VLLM_ENGINE_READY_TIMEOUT_S": "120",
        },
        fakes=False,
    )


def _killed_at(stderr: str) -> float:
    killed = re.search(r"TEST-HOOK killed EngineCore_DP0 at ([\d.]+)", stderr)
    assert killed, stderr[-6000:]
    return float(killed.group(1))


def _the_patch_named_the_death(log: str) -> None:
    assert "Timed out waiting for engines" not in log, log[-6000:]
    # The patch's line: the process, and why it died.
    assert re.search(r"engine core process EngineCore_DP0 \(pid \d+\) died", log)
    assert "killed by SIGKILL: most likely the out-of-memory killer" in log
    # vLLM's own monitor took over and marked the engine dead.
    assert "Engine core proc EngineCore_DP0 died unexpectedly" in log


def test_demo_ends_within_seconds_when_the_engine_dies_after_its_handshake(
    tmp_path: Path,
) -> None:
    args = ["demo", "--json", "--model", "qwen3", "--max-tokens", "2"]
    proc = run_bounded(
        [sys.executable, "-c", HOOKED_DEMO + DEMO_MAIN, *args],
        _env(tmp_path),
        timeout=400,
    )
    ended = time.time()
    killed = _killed_at(proc.stderr)
    tail = proc.stderr[-6000:]
    assert proc.returncode == 1, tail
    error = json.loads(proc.stdout)  # the only thing on stdout
    assert error["exit_code"] == 1 and error["cause"] == "engine core died", error
    assert "engine core process died (EngineDeadError)" in error["error"]
    _the_patch_named_the_death(proc.stderr)
    # A bound on a hang (vLLM's wait is 120 s here), not a speed measurement.
    assert ended - killed < 60, tail


def test_vllm_serve_exits_within_seconds_when_the_engine_dies_after_its_handshake(
    tmp_path: Path,
) -> None:
    from vllm_kunlun.demo.tiny_model import ensure_tiny_model

    model = ensure_tiny_model(tmp_path / "tiny")
    with socket.socket() as s:  # a free port for the server it never opens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["serve", str(model), "--dtype", "float32", "--max-model-len", "512"]
    proc = run_bounded(
        [sys.executable, "-c", HOOKED_DEMO + SERVE_MAIN, *args, "--port", str(port)],
        _env(tmp_path),
        timeout=400,
    )
    ended = time.time()
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, log[-6000:]
    assert "EngineDeadError" in proc.stderr, log[-6000:]
    _the_patch_named_the_death(log)
    assert ended - _killed_at(proc.stderr) < 60, log[-6000:]
