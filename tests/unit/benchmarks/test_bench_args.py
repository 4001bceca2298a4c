"""Every benchmark refuses an unknown mode or malformed choice: exit 2, naming the valid
ones (an unknown name used to select nothing and print an empty table, exit 0)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.bench_module import load_benchmark


def _refused(call: Callable[[], Any], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        call()
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_decode_unknown_engine(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("decode")
    err = _refused(lambda: bench.parse_args(["--engines", "ours,bogus"]), capsys)
    assert "unknown engine(s) 'bogus'" in err
    assert "'ours', 'native'" in err
    err = _refused(
        lambda: bench.parse_args(["--device", "cuda", "--engines", "ours"]), capsys
    )
    assert "valid engines: 'graphs', 'eager'" in err
    assert bench.parse_args(["--engines", " native "]).engines == " native "


def test_int8_linear_unknown_shape_and_bad_tokens(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = load_benchmark("int8_linear")
    err = _refused(lambda: bench.parse_args(["--shapes", "mlp.up_proj"]), capsys)
    assert "unknown shape(s) 'mlp.up_proj'" in err
    for name in bench.SHAPES:
        assert repr(name) in err
    err = _refused(lambda: bench.parse_args(["--tokens", "1,x"]), capsys)
    assert "--tokens '1,x'" in err
    assert bench.parse_args(["--shapes", "mlp.down_proj"]).shapes == "mlp.down_proj"


def test_serve_bad_concurrency(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("serve")
    err = _refused(lambda: bench.main(["--concurrency", "1,lots"]), capsys)
    assert "--concurrency '1,lots'" in err


@pytest.mark.parametrize("name", ["serve", "throughput"])
def test_unknown_profile(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark(name)
    err = _refused(lambda: bench.main(["--profile", "bogus"]), capsys)
    assert "invalid choice: 'bogus'" in err
    for profile in bench.PROFILES:
        assert repr(profile) in err
