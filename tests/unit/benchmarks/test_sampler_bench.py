"""benchmarks/sampler.py: mode selection and the report it prints."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.bench_module import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("sampler")


def test_unknown_mode_is_an_error_listing_the_valid_ones(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--modes", "top-p 0.9,top-p 0.95"])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert "unknown mode(s) 'top-p 0.95'" in err
    for name, *_ in bench.MODES:
        assert repr(name) in err


def test_known_modes_are_accepted(bench: ModuleType) -> None:
    args = bench.parse_args(["--modes", " top-p 0.9 , all rows seeded"])
    assert bench.selected_modes(args.modes) == ["top-p 0.9", "all rows seeded"]
    assert bench.selected_modes(bench.parse_args([]).modes) == []


def test_report_table_has_the_read_ratio(bench: ModuleType) -> None:
    report = {
        "batch": 2,
        "vocab": 10,
        "dtype": "float32",
        "device": "cpu",
        "device_name": "cpu",
        "threads": 1,
        "iters": 1,
        "torch": "t",
        "vllm": "v",
        "ours_kernels": "portable",
        "results": [
            {
                "mode": "top-p 0.9",
                "ours_ms": 30.0,
                "native_ms": 300.0,
                "speedup": 10.0,
                "read_ms": 10.0,
                "ours_reads": 3.0,
                "ours_gbps": 1.0,
                "ours_cpu_ms": 20.0,
                "ours_cpu_reads": 2.5,
            }
        ],
    }
    table = bench.markdown(report)
    assert "| top-p 0.9 | 30.0 | 3.0 | 300.0 | 10.00x | 10.0 | 20.0 | 2.5 |" in table
