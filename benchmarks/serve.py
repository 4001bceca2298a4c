"""Online serving through the plugin: ``vllm serve`` driven by vLLM's ``vllm bench serve``.

Why: the deployment log's job (docs/deployment-log.md) is a server at high concurrency measured by vLLM's own
client, not the offline engine; latency (TTFT, TPOT) and throughput move differently
with concurrency, so each level is its own run against the same server. What the log
learned is kept: the random dataset always gets explicit input / output lengths (0.15.1's
defaults, 1024 / 128, silently win otherwise) and ``--ignore-eos`` keeps every answer at
the asked length.

How: start the server (``vllm_kunlun.demo.server_process``: free loopback port, ``/health``),
run ``vllm bench serve`` once per concurrency (``--num-prompts`` = 4 x concurrency, at
least 8; request rate unlimited, the concurrency caps it), print one table row per level
with the output-throughput ratio to concurrency 1 in the same run, then stop the server
with SIGINT and say whether any of its processes had to be killed.

Profiles:
- ``emulation-tiny``: the tiny local Qwen3 in host emulation (any CPU host; its numbers
  say nothing about a Kunlun card, they track the serving path);
- ``kunlun``: a real model on Kunlun cards (``--model``, ``--tensor-parallel-size``).

    python benchmarks/serve.py --profile emulation-tiny
    python benchmarks/serve.py --profile kunlun --model /models/Qwen3-8B \\
        --tensor-parallel-size 8 --concurrency 1,16,64,256
    python benchmarks/serve.py --plot serve.png    # and a picture (matplotlib)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import random_dataset_args  # noqa: E402  (a sibling script)

SERVED_NAME = "bench"
METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass(frozen=True)
class Profile:
    name: str
    input_len: int
    output_len: int
    server_args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    tiny_model: bool = False


PROFILES = {
    p.name: p
    for p in (
        Profile(
            "emulation-tiny",
            input_len=64,
            output_len=32,
            server_args=(
                "--dtype",
                "float32",
                "--max-model-len",
                "512",
                "--max-num-seqs",
                "64",
            ),
            env={"VLLM_KUNLUN_HOST_EMULATION": "1"},
            tiny_model=True,
        ),
        Profile(
            "kunlun",
            input_len=512,
            output_len=512,
            # The log's working setting: 0.9 left no room for the GDN state.
            server_args=("--gpu-memory-utilization", "0.75", "--max-num-seqs", "256"),
        ),
    )
}


def num_prompts(concurrency: int) -> int:
    return max(8, 4 * concurrency)


def bench_command(
    profile: Profile,
    base_url: str,
    tokenizer: str,
    concurrency: int,
    result_dir: Path,
    result_file: str,
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        base_url,
        "--model",
        SERVED_NAME,
        "--tokenizer",
        tokenizer,
        *random_dataset_args(profile.input_len, profile.output_len),
        "--ignore-eos",
        "--num-prompts",
        str(num_prompts(concurrency)),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        "inf",
        "--percentile-metrics",
        ",".join(METRICS),
        "--metric-percentiles",
        "50,99",
        "--seed",
        "0",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        result_file,
    ]


def summary(concurrency: int, bench: dict[str, Any]) -> dict[str, Any]:
    """The numbers of one level, from ``vllm bench serve``'s result JSON."""
    row: dict[str, Any] = {
        "concurrency": concurrency,
        "completed": bench["completed"],
        "failed": bench.get("failed", 0),
        "request_throughput": bench["request_throughput"],
        "output_throughput": bench["output_throughput"],
    }
    for metric in ("ttft", "tpot"):
        row[f"median_{metric}_ms"] = bench[f"median_{metric}_ms"]
        row[f"p99_{metric}_ms"] = bench[f"p99_{metric}_ms"]
    return row


TABLE_HEADER = (
    "| concurrency | prompts ok/failed | req/s | output tok/s | x vs c=1 | "
    "TTFT median / p99 ms | TPOT median / p99 ms |\n|---|---|---|---|---|---|---|"
)


def table_row(row: dict[str, Any], base_output: float | None) -> str:
    ratio = f"{row['output_throughput'] / base_output:.2f}" if base_output else "-"
    return (
        f"| {row['concurrency']} | {row['completed']}/{row['failed']} | "
        f"{row['request_throughput']:.2f} | {row['output_throughput']:.1f} | {ratio} | "
        f"{row['median_ttft_ms']:.1f} / {row['p99_ttft_ms']:.1f} | "
        f"{row['median_tpot_ms']:.1f} / {row['p99_tpot_ms']:.1f} |"
    )


def table(rows: list[dict[str, Any]]) -> str:
    base = next((r["output_throughput"] for r in rows if r["concurrency"] == 1), None)
    return "\n".join([TABLE_HEADER, *(table_row(r, base) for r in rows)])


def plot(result: dict[str, Any], path: Path) -> Path:
    """Output tok/s and the TTFT / TPOT medians against concurrency, the numbers
    ``table`` prints (p99s stay in the table: one run's tail is noise)."""
    plots = load_plots()
    p = result["profile"]
    out, ttft, tpot = "output tok/s", "TTFT median ms", "TPOT median ms"
    table = plots.Table(
        title=(
            f"vllm bench serve, {p['name']}: {p['input_len']}/{p['output_len']} "
            f"tokens, TP {result['tensor_parallel_size']}, {result['date']}"
        ),
        columns=["concurrency", out, ttft, tpot],
        rows=[
            [
                r["concurrency"],
                r["output_throughput"],
                r["median_ttft_ms"],
                r["median_tpot_ms"],
            ]
            for r in result["rows"]
        ],
    )
    panels = [
        plots.Panel([out], out),
        plots.Panel([ttft, tpot], "median ms (log)", log=True),
    ]
    return Path(plots.draw(path, table, panels, kind="lines"))


def load_plots() -> ModuleType:
    """benchmarks/plots.py, loaded only for --plot: it needs matplotlib, an extra
    (benchmarks/ is on sys.path already, for the sibling ``throughput``)."""
    import plots

    return plots


def resolve_model(profile: Profile, model: str | None) -> str:
    if profile.tiny_model:
        from vllm_kunlun.demo.tiny_model import default_cache_dir, ensure_tiny_model

        return str(ensure_tiny_model(model or default_cache_dir()))
    if not model:
        raise SystemExit(f"profile {profile.name} needs --model PATH")
    return model


def run(
    profile: Profile,
    model: str | None,
    levels: list[int],
    tp: int,
    out_dir: Path,
) -> dict[str, Any]:
    from vllm_kunlun.demo.server_process import start_server

    model = resolve_model(profile, model)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = out_dir / f"serve-{profile.name}-{stamp}"
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **profile.env}
    args = [
        "--served-model-name",
        SERVED_NAME,
        "--tensor-parallel-size",
        str(tp),
        "--seed",
        "0",
        *profile.server_args,
    ]
    t0 = time.perf_counter()
    server = start_server(model, args, env, log_dir=run_dir)
    start_s = time.perf_counter() - t0
    print(f"server up in {start_s:.0f} s on {server.url} (log: {server.log_path})")
    rows: list[dict[str, Any]] = []
    try:
        for level in levels:
            name = f"c{level}.json"
            cmd = bench_command(profile, server.url, model, level, run_dir, name)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            (run_dir / f"c{level}.log").write_text(proc.stdout + proc.stderr)
            if proc.returncode != 0:
                raise SystemExit(
                    f"vllm bench serve at concurrency {level} failed (exit "
                    f"{proc.returncode}); log: {run_dir / f'c{level}.log'}\n"
                    + proc.stderr[-3000:]
                )
            rows.append(summary(level, json.loads((run_dir / name).read_text())))
            print(
                table_row(
                    rows[-1], rows[0]["output_throughput"] if levels[0] == 1 else None
                )
            )
    finally:
        stopped = server.stop()
    result = {
        "date": stamp,
        "profile": {k: v for k, v in vars(profile).items() if k != "env"},
        "env": profile.env,
        "model": model,
        "tensor_parallel_size": tp,
        "server_start_s": round(start_s, 1),
        "rows": rows,
        "stop": {
            "returncode": stopped.returncode,
            "seconds": round(stopped.seconds, 1),
            "leftover": stopped.leftover,
        },
        "run_dir": str(run_dir),
    }
    (run_dir / "result.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="emulation-tiny")
    parser.add_argument("--model", help="model directory (tiny model: default cache)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument(
        "--concurrency",
        default="1,16,64",
        help="comma-separated concurrency levels, one bench run each",
    )
    parser.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument(
        "--plot",
        type=Path,
        help="also draw output tok/s and TTFT / TPOT medians against concurrency "
        "into this PNG; needs matplotlib (pip install 'vllm-kunlun[bench]')",
    )
    args = parser.parse_args(argv)
    if args.plot and (error := load_plots().problem(args.plot)):
        parser.error(error)
    raw = [c.strip() for c in args.concurrency.split(",") if c.strip()]
    if not raw or not all(c.isdigit() and int(c) > 0 for c in raw):
        parser.error(
            f"--concurrency {args.concurrency!r}: expected positive integers separated "
            "by commas, e.g. 1,16,64"
        )
    levels = [int(c) for c in raw]
    profile = PROFILES[args.profile]
    result = run(profile, args.model, levels, args.tensor_parallel_size, args.out_dir)
    print()
    print(
        f"{profile.name}: {profile.input_len}/{profile.output_len} tokens, TP "
        f"{result['tensor_parallel_size']}, server start {result['server_start_s']} s"
    )
    print(table(result["rows"]))
    stop = result["stop"]
    print(
        f"server stopped by SIGINT in {stop['seconds']} s, exit {stop['returncode']}, "
        f"leftover processes: {', '.join(stop['leftover']) or 'none'}"
    )
    if args.plot:
        plot(result, args.plot)
    return 0 if not stop["leftover"] else 1


if __name__ == "__main__":
    sys.exit(main())
