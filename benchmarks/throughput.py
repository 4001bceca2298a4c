"""Engine throughput through the plugin with vLLM's own ``vllm bench throughput``.

Why: the number that matters is the engine's, measured by vLLM's own tool, with the
plugin active: the deployment log's decode stall (docs/deployment-log.md D11: 32 output tok/s, fixed to 3201) only
showed there. Two traps this script removes:
- in vLLM 0.15.1 the random dataset's ``--random-input-len`` / ``--random-output-len``
  default to 1024 / 128 and silently win over fixed-length arguments, so both are
  always passed explicitly;
- ``benchmarks/benchmark_throughput.py`` in vLLM's tree is a stub that exits 1: the
  entry point is the ``vllm bench throughput`` CLI.

Profiles:
- ``kunlun-short``: the log's "short 512/512 @ 256 concurrent" with
  ``--gpu-memory-utilization 0.75`` (0.9 left no room for the GDN state). Kunlun hosts;
  needs ``--model``.
- ``emulation-tiny``: the tiny local Qwen3 in host emulation; runs on any CPU host in
  under a minute, for regression tracking of the engine path (not of speed on Kunlun).

Results: one JSON file per run and a markdown table row, in ``--out-dir``.

    python benchmarks/throughput.py --profile emulation-tiny
    python benchmarks/throughput.py --profile kunlun-short --model /models/Qwen3-8B
    python benchmarks/throughput.py --profile emulation-tiny --plot throughput.png
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Profile:
    name: str
    input_len: int
    output_len: int
    num_prompts: int
    max_num_seqs: int
    emulation: bool
    tiny_model: bool
    extra: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


PROFILES = {
    p.name: p
    for p in (
        Profile(
            "kunlun-short",
            input_len=512,
            output_len=512,
            num_prompts=256,
            max_num_seqs=256,
            emulation=False,
            tiny_model=False,
            extra=("--gpu-memory-utilization", "0.75"),
        ),
        Profile(
            "emulation-tiny",
            input_len=128,
            output_len=64,
            num_prompts=64,
            max_num_seqs=64,
            emulation=True,
            tiny_model=True,
            extra=("--dtype", "float32", "--max-model-len", "512"),
            env={"VLLM_KUNLUN_HOST_EMULATION": "1"},
        ),
    )
}

_THROUGHPUT = re.compile(
    r"Throughput: ([\d.]+) requests/s, ([\d.]+) total tokens/s, "
    r"([\d.]+) output tokens/s"
)
_BANNERS = {
    "platform": re.compile(
        r"vllm-kunlun: (HOST EMULATION active|KunlunPlatform active)"
    ),
    "attention": re.compile(r"vllm-kunlun: (attention (?:backend|served by) [^\n]+)"),
    "sampling_kernels": re.compile(
        r"vllm-kunlun: sampling kernels on [^:\n]+: ([^\n]+)"
    ),
}


def random_dataset_args(input_len: int, output_len: int) -> list[str]:
    """vLLM's random dataset at fixed lengths (also used by benchmarks/serve.py)."""
    return [
        "--dataset-name",
        "random",
        # Explicit: 0.15.1's defaults (1024/128) would silently replace fixed lengths.
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        "--random-range-ratio",
        "0",
    ]


def build_command(profile: Profile, model: str, output_json: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "bench",
        "throughput",
        "--model",
        model,
        *random_dataset_args(profile.input_len, profile.output_len),
        "--num-prompts",
        str(profile.num_prompts),
        "--max-num-seqs",
        str(profile.max_num_seqs),
        "--seed",
        "0",
        "--output-json",
        str(output_json),
        *profile.extra,
    ]


def parse_output(text: str) -> dict[str, Any]:
    """The throughput line and what served it, from the bench's stdout + log."""
    m = _THROUGHPUT.search(text)
    if m is None:
        raise RuntimeError(
            "vllm bench throughput printed no 'Throughput: ...' line; see the log"
        )
    found: dict[str, Any] = {
        "requests_per_s": float(m.group(1)),
        "total_tokens_per_s": float(m.group(2)),
        "output_tokens_per_s": float(m.group(3)),
    }
    for key, pattern in _BANNERS.items():
        hit = pattern.search(text)
        found[key] = hit.group(1) if hit else None
    return found


def markdown_row(result: dict[str, Any]) -> str:
    p = result["profile"]
    return (
        f"| {result['date']} | {p['name']} | {p['input_len']}/{p['output_len']} "
        f"@ {p['max_num_seqs']} | {result['output_tokens_per_s']:.1f} | "
        f"{result['total_tokens_per_s']:.1f} | {result['requests_per_s']:.2f} | "
        f"{result['wall_s']:.1f} | {result['platform']} |"
    )


MARKDOWN_HEADER = (
    "| date | profile | in/out @ concurrency | output tok/s | total tok/s | req/s | "
    "wall s | platform |\n|---|---|---|---|---|---|---|---|"
)


def run(profile: Profile, model: str | None, out_dir: Path) -> dict[str, Any]:
    if profile.tiny_model:
        sys.path.insert(0, str(REPO))
        from vllm_kunlun.demo.tiny_model import default_cache_dir, ensure_tiny_model

        model = str(ensure_tiny_model(model or default_cache_dir()))
    if not model:
        raise SystemExit(f"profile {profile.name} needs --model PATH")
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    bench_json = out_dir / f"{profile.name}-{stamp}.bench.json"
    log_path = out_dir / f"{profile.name}-{stamp}.log"
    cmd = build_command(profile, model, bench_json)
    env = {**os.environ, **profile.env}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall_s = time.perf_counter() - t0
    log_path.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(
            f"vllm bench throughput failed (exit {proc.returncode}); log: {log_path}\n"
            + proc.stderr[-3000:]
        )
    result: dict[str, Any] = {
        "date": stamp,
        "profile": {k: v for k, v in vars(profile).items() if k != "env"},
        "model": model,
        "command": cmd,
        "env": profile.env,
        "wall_s": round(wall_s, 1),
        **parse_output(proc.stdout + proc.stderr),
        "vllm_bench": json.loads(bench_json.read_text()),
        "log": str(log_path),
    }
    (out_dir / f"{profile.name}-{stamp}.json").write_text(json.dumps(result, indent=2))
    table = out_dir / "throughput.md"
    if not table.exists():
        table.write_text(MARKDOWN_HEADER + "\n")
    with table.open("a") as f:
        f.write(markdown_row(result) + "\n")
    return result


def plot(result: dict[str, Any], path: Path) -> Path:
    """The run's output and total tok/s as bars, the numbers ``markdown_row`` prints
    (the history of runs stays in --out-dir's throughput.md)."""
    plots = load_plots()
    p = result["profile"]
    out, total = "output tok/s", "total tok/s"
    table = plots.Table(
        title=(
            f"vllm bench throughput, {p['input_len']}/{p['output_len']} @ "
            f"{p['max_num_seqs']}, {result['date']}: {result['platform']}"
        ),
        columns=["profile", out, total],
        rows=[[p["name"], result["output_tokens_per_s"], result["total_tokens_per_s"]]],
    )
    return Path(plots.draw(path, table, [plots.Panel([out, total], "tokens/s")]))


def load_plots() -> ModuleType:
    """benchmarks/plots.py, loaded only for --plot: it needs matplotlib, an extra."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import plots

    return plots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), required=True)
    parser.add_argument("--model", help="model directory (tiny model: default cache)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument(
        "--plot",
        type=Path,
        help="also draw the run's output and total tok/s into this PNG; needs "
        "matplotlib (pip install 'vllm-kunlun[bench]')",
    )
    args = parser.parse_args(argv)
    if args.plot and (error := load_plots().problem(args.plot)):
        parser.error(error)
    result = run(PROFILES[args.profile], args.model, args.out_dir)
    print(MARKDOWN_HEADER)
    print(markdown_row(result))
    print(
        f"served by: {result['platform']}; {result['attention']}; "
        f"sampling kernels: {result['sampling_kernels']}"
    )
    if args.plot:
        plot(result, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
