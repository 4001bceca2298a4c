"""benchmarks/mla.py: a tiny run end to end (both sides compute the same attention;
the bytes are the cache rows each reads), DeepSeek-V3's per-rank shape by default, and
malformed arguments refused before any work."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.bench_module import load_benchmark

TINY = ["--heads", "3", "--latent", "16", "--rope", "4", "--nope", "8", "--v-head", "6"]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("mla")


def test_defaults_are_deepseek_v3_on_one_of_8_ranks(bench: ModuleType) -> None:
    args = bench.parse_args([])
    shape = (args.heads, args.latent, args.rope, args.nope, args.v_head)
    assert shape == (128 // 8, 512, 64, 128, 128)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bf16", 5e-2)])
def test_a_tiny_run_compares_the_same_attention(
    bench: ModuleType,
    dtype: str,
    tol: float,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "mla.json"
    argv = [*TINY, "--batch", "1,3", "--context", "5,70", "--rounds", "2"]
    assert bench.main([*argv, "--dtype", dtype, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [(r["batch"], r["context"]) for r in report["rows"]] == [
        (1, 5),
        (1, 70),
        (3, 5),
        (3, 70),
    ]
    size = 4 if dtype == "float32" else 2
    for r in report["rows"]:
        assert r["mla_ms"] > 0 and r["mha_ms"] > 0
        assert r["max_diff"] < tol
        tokens = r["batch"] * r["context"]
        assert r["mla_kv_bytes"] == tokens * (16 + 4) * size
        assert r["mha_kv_bytes"] == tokens * 3 * (8 + 4 + 6) * size
    assert bench.markdown(report) in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--batch", "8,x"], "is not a list of integers"),
        (["--context", "0"], "every size must be at least 1"),
        (["--heads", "0"], "--heads must be at least 1"),
        (["--dtype", "fp8"], "invalid choice"),
    ],
)
def test_malformed_arguments_are_refused(
    bench: ModuleType, argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(argv)
    assert exit_info.value.code == 2
    assert words in capsys.readouterr().err
