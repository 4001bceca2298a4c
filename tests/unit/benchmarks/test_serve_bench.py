"""benchmarks/serve.py: the bench command it runs and the table it prints."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("serve")


def option(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_bench_command_pins_the_random_lengths(
    bench: ModuleType, tmp_path: Path
) -> None:
    profile = bench.PROFILES["emulation-tiny"]
    cmd = bench.bench_command(
        profile, "http://127.0.0.1:9", "/m", 16, tmp_path, "c16.json"
    )
    assert cmd[1:6] == [
        "-m",
        "vllm.entrypoints.cli.main",
        "bench",
        "serve",
        "--backend",
    ]
    # Explicit random lengths: 0.15.1's defaults (1024/128) would replace them.
    assert option(cmd, "--random-input-len") == "64"
    assert option(cmd, "--random-output-len") == "32"
    assert option(cmd, "--random-range-ratio") == "0"
    assert "--ignore-eos" in cmd
    assert option(cmd, "--max-concurrency") == "16"
    assert option(cmd, "--num-prompts") == "64"
    assert option(cmd, "--base-url") == "http://127.0.0.1:9"
    assert option(cmd, "--tokenizer") == "/m"
    assert option(cmd, "--metric-percentiles") == "50,99"


def test_prompts_per_level(bench: ModuleType) -> None:
    assert [bench.num_prompts(c) for c in (1, 16, 64)] == [8, 64, 256]


def test_table_from_bench_results(bench: ModuleType) -> None:
    def result(req_s: float, out_s: float, ttft: float, tpot: float) -> dict:
        return {
            "completed": 8,
            "failed": 0,
            "request_throughput": req_s,
            "output_throughput": out_s,
            "median_ttft_ms": ttft,
            "p99_ttft_ms": ttft * 2,
            "median_tpot_ms": tpot,
            "p99_tpot_ms": tpot * 3,
        }

    rows = [
        bench.summary(1, result(1.5, 50.0, 40.0, 5.0)),
        bench.summary(16, result(6.0, 200.0, 500.0, 50.0)),
    ]
    lines = bench.table(rows).splitlines()
    assert lines[0].startswith("| concurrency | prompts ok/failed | req/s |")
    assert lines[2] == "| 1 | 8/0 | 1.50 | 50.0 | 1.00 | 40.0 / 80.0 | 5.0 / 15.0 |"
    assert lines[3] == (
        "| 16 | 8/0 | 6.00 | 200.0 | 4.00 | 500.0 / 1000.0 | 50.0 / 150.0 |"
    )


def test_a_real_model_profile_needs_a_model(bench: ModuleType) -> None:
    with pytest.raises(SystemExit, match="needs --model"):
        bench.resolve_model(bench.PROFILES["kunlun"], None)
