"""benchmarks/moe.py: it runs end to end at a tiny shape (the three paths agree), its
picture is its table, and it refuses malformed arguments before any work."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.bench_module import load_benchmark
from tests.unit.benchmarks.plot_tables import (
    assert_table_matches,
    cells,
    check_png,
    column,
)

TINY = ["--hidden", "32", "--experts", "8", "--top-k", "2", "--inter", "16"]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("moe")


def test_defaults_are_qwen3_5_35b_a3b_shape(bench: ModuleType) -> None:
    args = bench.parse_args([])
    assert (args.hidden, args.experts, args.top_k, args.inter) == (2048, 256, 8, 512)
    assert args.tokens == "1,16,256" and args.dtype == "float32"


@pytest.mark.parametrize("dtype", ["float32", "bf16"])
def test_a_tiny_run_prints_json_and_a_plot_of_its_table(
    bench: ModuleType,
    dtype: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out, png = tmp_path / "moe.json", tmp_path / "moe.png"
    argv = [*TINY, "--tokens", "1,5", "--rounds", "2", "--dtype", dtype]
    assert bench.main([*argv, "--json", str(out), "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["shape"] == {"hidden": 32, "experts": 8, "top_k": 2, "inter": 16}
    assert [r["tokens"] for r in report["rows"]] == [1, 5]
    for r in report["rows"]:
        assert r["grouped_ms"] > 0 and r["dense_ms"] > 0 and r["loop_ms"] > 0
        assert r["vllm_ms"] > 0 and r["floor_ms"] > 0
        assert r["max_diff_vs_loop"] < (1e-5 if dtype == "float32" else 5e-2)
        assert r["vllm_max_diff_vs_loop"] < (1e-5 if dtype == "float32" else 5e-2)
        assert 2 <= r["active_experts"] <= 8
    assert bench.markdown(report) in printed
    embedded = check_png(png, bench.load_plots())
    assert_table_matches(
        embedded,
        cells(bench.markdown(report)),
        column("tokens"),
        {
            name: column(name)
            for name in ("grouped ms", "dense ms", "loop ms", "vllm ms", "floor ms")
        },
    )


def test_the_dense_equivalent_has_the_experts_active_parameters(
    bench: ModuleType,
) -> None:
    args = bench.parse_args(TINY)
    w = bench.layer(args)
    active = 2 * (w["w13"][0].numel() + w["w2"][0].numel())  # top-2 experts
    assert w["dense_w1"].numel() + w["dense_w2"].numel() == active


def _refused(bench: ModuleType, argv: list[str], capsys: Any) -> str:
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(argv)
    assert exit_info.value.code == 2
    return str(capsys.readouterr().err)


def test_malformed_arguments_are_refused(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "--tokens '1,x'" in _refused(bench, ["--tokens", "1,x"], capsys)
    assert "--top-k 9" in _refused(bench, [*TINY, "--top-k", "9"], capsys)
    assert "--rounds" in _refused(bench, ["--rounds", "0"], capsys)
    assert "invalid choice" in _refused(bench, ["--dtype", "fp8"], capsys)


def test_missing_matplotlib_is_refused_before_any_work(
    bench: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)

    def started(*args: Any) -> None:
        raise AssertionError("the work started despite a bad --plot")

    monkeypatch.setattr(bench, "run", started)
    with pytest.raises(SystemExit) as exit_info:
        bench.main([*TINY, "--plot", str(tmp_path / "moe.png")])
    assert exit_info.value.code == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err
