"""benchmarks/lora.py: its scenarios, arithmetic and refusals (the engines themselves
run for minutes and are not started here)."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.conftest import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("lora")


def test_scenarios_are_0_1_and_4_adapters_against_the_base(bench: ModuleType) -> None:
    assert bench.SCENARIOS == {"lora0": 0, "lora1": 1, "lora4": 4}
    assert bench.assignment(0, 3) == [None, None, None]
    assert bench.assignment(1, 3) == [0, 0, 0]
    # Four adapters over six requests: every slot in use, round robin.
    assert bench.assignment(4, 6) == [0, 1, 2, 3, 0, 1]


def test_decode_throughput_leaves_the_prefill_out(bench: ModuleType) -> None:
    # 8 requests x 15 decoded tokens in 3.0 s - 1.0 s of prefill.
    assert bench.decode_tok_s(8, 16, 1.0, 3.0) == pytest.approx(60.0)


def test_rows_are_medians_with_their_ratio_to_the_base(bench: ModuleType) -> None:
    rows = bench.summarize(
        {"base": [100.0, 90.0, 110.0], "lora0": [95.0], "lora4": [40.0, 60.0]}
    )
    by_name = {r["scenario"]: r for r in rows}
    assert by_name["base"]["vs_base"] == 1.0
    assert by_name["lora0"]["vs_base"] == pytest.approx(0.95)
    assert by_name["lora4"]["decode_tok_s"] == 50.0
    assert by_name["lora4"]["vs_base"] == pytest.approx(0.5)
    assert by_name["lora4"]["adapters"] == 4


@pytest.mark.parametrize("argv", [["--output-len", "1"], ["--rank", "128"]])
def test_bad_arguments_are_refused(bench: ModuleType, argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
