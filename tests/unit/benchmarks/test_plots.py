"""The benchmarks' ``--plot``: each picture carries the table it draws, and that table
is the one the benchmark prints; a plot that cannot be drawn is refused before any
measuring starts; matplotlib stays a benchmark extra the plugin never loads."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, load_benchmark, run_python
from tests.unit.benchmarks.plot_tables import (
    assert_table_matches,
    cells,
    check_png,
    column,
    first_table,
    same_value,
)


def test_sampler_plot_is_its_table(tmp_path: Path) -> None:
    bench = load_benchmark("sampler")
    modes = [("no filter", 11.84, 411.53, 9.41), ("top-p 0.9", 20.66, 5190.4, 9.72)]
    report = {
        "batch": 256, "vocab": 151936, "dtype": "float32", "device": "cpu",
        "device_name": "cpu", "threads": 1, "iters": 5, "torch": "t", "vllm": "v",
        "ours_kernels": "native (the logits are on the cpu)",
        "results": [
            {"mode": m, "ours_ms": o, "native_ms": n, "read_ms": r,
             "speedup": n / o, "ours_reads": o / r, "ours_cpu_ms": o,
             "ours_cpu_reads": o / r}
            for m, o, n, r in modes
        ],
    }  # fmt: skip
    path = bench.plot(report, tmp_path / "sampler.png")
    embedded = check_png(path, bench.load_plots())
    assert_table_matches(
        embedded,
        cells(bench.markdown(report)),
        column("mode"),
        {
            name: column(name)
            for name in ("ours ms/step", "vLLM native ms/step", "one read ms")
        },
    )
    assert "ours = native" in embedded.title


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_decode_plot_is_its_table(tmp_path: Path, device: str) -> None:
    bench = load_benchmark("decode")
    names = ("ours", "native") if device == "cpu" else ("graphs", "eager")
    rows = [
        {"engine": name, "sampler": "ours", "graphs": name == "graphs",
         "num_seqs": 256, "prompt_len": 8, "output_len": 64,
         "t_runs_s": [15.0, 15.2, 15.1], "output_tok_s": tok_s,
         "decode_ms_per_step": ms}
        for name, tok_s, ms in zip(
            names, (1088.44, 509.66), (211.71, 479.08), strict=True
        )
    ]  # fmt: skip
    path = bench.plot(rows, tmp_path / "decode.png")
    embedded = check_png(path, bench.load_plots())
    assert_table_matches(
        embedded,
        cells(bench.table(rows, baseline=names[1])),
        column("engine"),
        {name: column(name) for name in ("output tok/s", "decode ms/step")},
    )
    assert f"{names[0]} = 2.14x {names[1]}" in embedded.title


def test_serve_plot_is_its_table(tmp_path: Path) -> None:
    bench = load_benchmark("serve")

    def level(c: int, out: float, ttft: float, tpot: float) -> dict[str, Any]:
        return bench.summary(
            c,
            {"completed": 4 * c, "failed": 0, "request_throughput": out / 32,
             "output_throughput": out, "median_ttft_ms": ttft,
             "p99_ttft_ms": 2 * ttft, "median_tpot_ms": tpot,
             "p99_tpot_ms": 3 * tpot},
        )  # fmt: skip

    result = {
        "date": "20261203-190000",
        "profile": {"name": "emulation-tiny", "input_len": 64, "output_len": 32},
        "tensor_parallel_size": 1,
        "rows": [
            level(1, 50.04, 40.26, 5.01),
            level(16, 200.3, 500.55, 50.2),
            level(64, 310.77, 1900.12, 120.9),
        ],
    }
    path = bench.plot(result, tmp_path / "serve.png")
    embedded = check_png(path, bench.load_plots())
    assert_table_matches(
        embedded,
        cells(bench.table(result["rows"])),
        column("concurrency"),
        {
            "output tok/s": column("output tok/s"),
            "TTFT median ms": column("TTFT median / p99 ms", 0),
            "TPOT median ms": column("TPOT median / p99 ms", 0),
        },
    )


def test_throughput_plot_is_its_table(tmp_path: Path) -> None:
    bench = load_benchmark("throughput")
    profile = bench.PROFILES["emulation-tiny"]
    result = {
        "date": "20261203-190000",
        "profile": {k: v for k, v in vars(profile).items() if k != "env"},
        "output_tokens_per_s": 262.75,
        "total_tokens_per_s": 788.24,
        "requests_per_s": 4.11,
        "wall_s": 40.2,
        "platform": "HOST EMULATION active",
    }
    path = bench.plot(result, tmp_path / "throughput.png")
    embedded = check_png(path, bench.load_plots())
    printed = bench.MARKDOWN_HEADER + "\n" + bench.markdown_row(result)
    assert_table_matches(
        embedded,
        cells(printed),
        column("profile"),
        {name: column(name) for name in ("output tok/s", "total tok/s")},
    )


def test_int8_linear_plot_is_its_table(tmp_path: Path) -> None:
    bench = load_benchmark("int8_linear")
    rows = [
        {"shape": shape, "tokens": m, "out": 4352, "in": 5120, "ours_ms": o,
         "float_ms": f, "ratio": o / f, "product": "int32 mm",
         "weight_bytes_ours": 1 << 20, "weight_bytes_float": 4 << 20}
        for shape, m, o, f in (
            ("mlp.gate_up_proj", 1, 0.912, 1.337),
            ("mlp.down_proj", 256, 25.5, 19.04),
        )
    ]  # fmt: skip
    report = {
        "device": "cpu", "dtype": "float32", "iters": 5, "torch": "t",
        "threads": 2, "rows": rows, "memory": bench.memory_table(),
    }  # fmt: skip
    path = bench.plot(report, tmp_path / "int8.png")
    embedded = check_png(path, bench.load_plots())
    assert_table_matches(
        embedded,
        cells(bench.markdown(report)),
        lambda row: f"{row['layer (per card, TP 8)']} x {row['tokens']}",
        {name: column(name) for name in ("ours ms", "float ms")},
    )


# ---- refusals: before any work ------------------------------------------------------

# benchmark -> (arguments besides --plot, the functions that would start the work)
WORK = {
    "sampler": ([], ["run"]),
    "decode": ([], ["model_dir", "Child"]),
    "serve": ([], ["run"]),
    "throughput": (["--profile", "emulation-tiny"], ["run"]),
    "int8_linear": ([], ["run"]),
}


def refused(
    name: str,
    plot: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> str:
    """Run the benchmark's main with ``--plot plot``; it must exit 2 before its work."""
    bench = load_benchmark(name)
    argv, work = WORK[name]

    def started(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"{name}: the work started despite a bad --plot")

    for fn in work:
        monkeypatch.setattr(bench, fn, started)
    with pytest.raises(SystemExit) as exit_info:
        bench.main([*argv, "--plot", str(plot)])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(WORK))
def test_missing_matplotlib_is_refused_naming_the_fix(
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    err = refused(name, tmp_path / "out.png", monkeypatch, capsys)
    assert "--plot needs matplotlib" in err
    assert "pip install 'vllm-kunlun[bench]'" in err
    assert "requirements/dev.lock" in err
    assert not (tmp_path / "out.png").exists()


@pytest.mark.parametrize("name", sorted(WORK))
def test_unwritable_plot_path_is_refused(
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refused(name, tmp_path / "no-such-dir" / "out.png", monkeypatch, capsys)
    assert "cannot write there" in err and "No such file or directory" in err
    (tmp_path / "a-file").write_text("")
    err = refused(name, tmp_path / "a-file" / "out.png", monkeypatch, capsys)
    assert "cannot write there" in err
    err = refused(name, tmp_path / "out.svg", monkeypatch, capsys)
    assert "ending in .png" in err


def test_a_good_path_passes_and_leaves_nothing_behind(tmp_path: Path) -> None:
    bench = load_benchmark("sampler")
    args = bench.parse_args(["--plot", str(tmp_path / "out.png")])
    assert args.plot == tmp_path / "out.png"
    assert not args.plot.exists()  # the check's probe file is gone
    existing = tmp_path / "old.png"
    existing.write_bytes(b"old")
    bench.parse_args(["--plot", str(existing)])
    assert existing.read_bytes() == b"old"  # an existing file is not truncated early


# ---- matplotlib is not the plugin's -------------------------------------------------


def test_no_plugin_module_imports_matplotlib() -> None:
    """Lazy imports inside functions count: every import statement of the package."""
    offenders = []
    for path in sorted((REPO / "vllm_kunlun").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            if any(n.split(".")[0] in ("matplotlib", "plots") for n in names):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders


def test_plugin_and_cli_do_not_load_matplotlib() -> None:
    """Importing the plugin, its entry points and its command line (every subcommand's
    parser) leaves matplotlib unloaded, so the extra is never needed at run time."""
    proc = run_python(
        """
        import sys
        import vllm_kunlun
        from vllm_kunlun import cli

        vllm_kunlun.register()
        cli.build_parser()
        assert cli.main(["versions", "--json"]) in (0, 1)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "matplotlib")
        print("MATPLOTLIB", loaded)
        """,
        fakes=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "MATPLOTLIB []" in proc.stdout, proc.stdout[-3000:]


def test_committed_sampler_pictures_show_docs_sampler_table() -> None:
    """docs/sampler.md's newest run and docs/img/'s pictures come from one run."""
    plots = load_benchmark("sampler").load_plots()
    text = (REPO / "docs" / "sampler.md").read_text()
    rows = first_table(text[text.index("## Benchmark") :])[1:]
    for picture, ours_col, speedup_col in (
        ("sampler-cpu.png", 1, 3),
        ("sampler-cpu-2threads.png", 4, 6),
    ):
        embedded = plots.read_table(REPO / "docs" / "img" / picture)
        assert [row[0] for row in embedded.rows] == [row[0] for row in rows]
        for (_, ours, native, _), shown in zip(embedded.rows, rows, strict=True):
            assert same_value(shown[ours_col], ours), (picture, shown)
            assert same_value(shown[speedup_col].rstrip("x"), native / ours)
