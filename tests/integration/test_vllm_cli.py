"""The ``vllm`` command on this stack, as a user runs it (real processes, real vLLM)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, child_env
from vllm_kunlun.demo.server_process import ServerError, start_server

pytestmark = pytest.mark.slow

VLLM = [sys.executable, "-m", "vllm.entrypoints.cli.main"]


def run_vllm(
    args: list[str], env: dict[str, str], fakes: bool
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*VLLM, *args],
        env=child_env(env, fakes=fakes),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )


def test_client_command_works_without_a_device_or_emulation() -> None:
    """No torch_xmlir, no VLLM_KUNLUN_*: torch 2.5.1 still needs the schema fix."""
    proc = run_vllm(["bench", "serve", "--help"], {}, fakes=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Benchmark the online serving throughput" in proc.stdout
    assert "infer_schema" not in proc.stderr


def test_serve_refuses_malformed_variables_at_start(tmp_path: Path) -> None:
    """Refused while the platform starts, before any model or port is touched."""
    env = {
        "VLLM_KUNLUN_HOST_EMULATION": "1",
        "VLLM_KUNLUN_SAMPLER": "fast",
        "VLLM_KUNLUN_EMULATION_KV_CACHE_GIB": "inf",
    }
    with pytest.raises(ServerError, match="exited at start") as err:
        start_server(
            str(tmp_path / "no-model-needed"), env=child_env(env), log_dir=tmp_path
        )
    log = str(err.value)
    assert "EnvVarError: vllm-kunlun: 2 malformed environment variable(s)" in log
    assert "VLLM_KUNLUN_SAMPLER='fast' is not valid; use one of: auto, vendor" in log
    assert "VLLM_KUNLUN_EMULATION_KV_CACHE_GIB='inf' must be a positive number" in log
    assert "OverflowError" not in log and "ModelPathError" not in log


def test_serve_without_a_device_says_why(tmp_path: Path) -> None:
    """vLLM alone would say "Failed to infer device type"."""
    proc = run_vllm(["serve", str(tmp_path / "model")], {}, fakes=False)
    assert proc.returncode != 0
    err = proc.stderr + proc.stdout
    assert "NoDeviceError: vllm-kunlun: this vLLM command needs a device" in err
    assert "VLLM_KUNLUN_HOST_EMULATION=1" in err
    assert "Failed to infer device type" not in err
