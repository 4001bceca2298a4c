"""benchmarks/throughput.py: the command it runs and how it reads the result."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("throughput")


def option(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_kunlun_short_is_the_logs_profile(bench: ModuleType, tmp_path: Path) -> None:
    cmd = bench.build_command(bench.PROFILES["kunlun-short"], "/m", tmp_path / "o")
    assert cmd[1:5] == ["-m", "vllm.entrypoints.cli.main", "bench", "throughput"]
    # Explicit random lengths: 0.15.1's defaults (1024/128) would replace them.
    assert option(cmd, "--random-input-len") == "512"
    assert option(cmd, "--random-output-len") == "512"
    assert option(cmd, "--random-range-ratio") == "0"
    assert option(cmd, "--max-num-seqs") == "256"
    assert option(cmd, "--num-prompts") == "256"
    assert option(cmd, "--gpu-memory-utilization") == "0.75"


def test_emulation_profile_runs_in_host_emulation(bench: ModuleType) -> None:
    profile = bench.PROFILES["emulation-tiny"]
    assert profile.env == {"VLLM_KUNLUN_HOST_EMULATION": "1"}
    assert profile.tiny_model


def test_parse_output_reads_throughput_and_what_served(bench: ModuleType) -> None:
    text = (
        "INFO [platform.py:58] vllm-kunlun: HOST EMULATION active (...)\n"
        "INFO [__init__.py:81] vllm-kunlun: attention backend CUSTOM = portable\n"
        "INFO [chooser.py:132] vllm-kunlun: sampling kernels on cpu: portable (cpu)\n"
        "Throughput: 4.11 requests/s, 788.24 total tokens/s, 262.75 output tokens/s\n"
    )
    found = bench.parse_output(text)
    assert found["requests_per_s"] == 4.11
    assert found["total_tokens_per_s"] == 788.24
    assert found["output_tokens_per_s"] == 262.75
    assert found["platform"] == "HOST EMULATION active"
    assert found["attention"] == "attention backend CUSTOM = portable"
    assert found["sampling_kernels"] == "portable (cpu)"
    with pytest.raises(RuntimeError, match="no 'Throughput"):
        bench.parse_output("engine died")
