"""Sampler probe: vllm-kunlun's sampler vs vLLM 0.15.1's TopKTopPSampler.forward_native.

The deployment's decode stall: 256 requests x 152K vocabulary, vLLM's native sampler
at 4.89 s per step on Kunlun (its exponential_ noise ran on the CPU). This probe times,
on the same float32 logits in the same run, one sampling step of

* ours: ``KunlunTopKTopPSampler.forward`` (the kernels ``select_kernels`` picks for
  the device: portable torch on CPU / non-Kunlun CUDA, the vendor kernel on Kunlun), and
* native: vLLM's own ``TopKTopPSampler.forward_native``,

in six modes: no filter, top-k 50, top-p 0.9, top-k 50 + top-p 0.9, every row seeded,
half the rows seeded (seeded modes: no top-k / top-p, the case that crashed). Reported:
median ms per step, the speed-up (native / ours), and ours in units of one read: the
median time of a row max (``logits.amax(-1)``) over the same logits, timed alongside
every mode; also the process CPU time of ours and of the read (on a CPU shared with
other jobs, wall time mostly measures the share of the cores the process got). The
JSON adds the effective bandwidth (batch x vocab x 4 bytes / time).

    python benchmarks/sampler.py                       # 256 x 151936 on the CPU
    python benchmarks/sampler.py --device cuda --iters 20 --json out.json
    python benchmarks/sampler.py --modes "top-p 0.9,all rows seeded"
    python benchmarks/sampler.py --threads 1           # steadier on a shared machine
    python benchmarks/sampler.py --plot sampler.png    # and a picture (matplotlib)

Each timed call gets a fresh copy of the logits (both samplers may work in place); the
copy is not timed. Calls alternate (read, ours, native, read, ...), so a change in
machine load affects all three. On CUDA every call is synchronised before and after.
An unknown mode name is an error that lists the valid ones.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

MODES = (
    ("no filter", None, None, "none"),
    ("top-k 50", 50, None, "none"),
    ("top-p 0.9", None, 0.9, "none"),
    ("top-k 50 + top-p 0.9", 50, 0.9, "none"),
    ("all rows seeded", None, None, "all"),
    ("half rows seeded", None, None, "half"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--iters", type=int, default=5, help="timed calls per mode")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="CPU threads for torch (default: torch's own choice); 1 avoids the "
        "stalls of multi-threaded operations on a machine shared with other jobs",
    )
    names = ", ".join(repr(m[0]) for m in MODES)
    parser.add_argument(
        "--modes",
        default="",
        help=f"comma-separated subset of mode names (default all): {names}",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--plot",
        type=Path,
        help="also draw ms per mode (ours, vLLM native, one read) into this PNG; "
        "needs matplotlib (pip install 'vllm-kunlun[bench]')",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(selected_modes(args.modes)) - {m[0] for m in MODES})
    if unknown:
        parser.error(
            f"unknown mode(s) {', '.join(map(repr, unknown))}; valid modes: {names}"
        )
    if args.plot and (error := load_plots().problem(args.plot)):
        parser.error(error)
    return args


def load_plots() -> ModuleType:
    """benchmarks/plots.py, loaded only for --plot: it needs matplotlib, an extra."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import plots

    return plots


def selected_modes(spec: str) -> list[str]:
    """Mode names from a comma-separated ``--modes`` value (empty: none named)."""
    return [m.strip() for m in spec.split(",") if m.strip()]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _row_max(x: torch.Tensor) -> torch.Tensor:
    """One read of the logits: the reference the modes are measured against."""
    return x.amax(dim=-1)


def time_call(
    fn: Callable[[torch.Tensor], Any], logits: torch.Tensor
) -> tuple[float, float]:
    """(wall, process CPU) seconds of ``fn(copy of logits)``; the copy is made outside
    the timer. On a shared CPU the CPU time is the steadier measure of the work."""
    x = logits.clone()
    _sync(logits.device)
    start, cpu = time.perf_counter(), time.process_time()
    tokens = fn(x)
    _sync(logits.device)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert tokens.shape == (logits.shape[0],)
    return elapsed, cpu


def time_pair(
    fns: dict[str, Callable[[torch.Tensor], Any]],
    logits: torch.Tensor,
    iters: int,
    warmup: int,
) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per function, calls interleaved (read, ours, native,
    read, ...) so that a change in machine load hits all alike."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    for i in range(warmup + iters):
        for name, fn in fns.items():
            measured = time_call(fn, logits)
            if i >= warmup:
                times[name].append(measured)
    return {
        name: (
            statistics.median(w for w, _ in t),
            statistics.median(c for _, c in t),
        )
        for name, t in times.items()
    }


def generators(
    kind: str, batch: int, device: torch.device, seed: int
) -> dict[int, torch.Generator]:
    rows = {"none": [], "all": range(batch), "half": range(0, batch, 2)}[kind]
    return {i: torch.Generator(device=device).manual_seed(seed + i) for i in rows}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from vllm_kunlun.patching import schema

    schema.apply()  # torch 2.5.1 cannot import vllm.v1 without it
    import vllm
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    from vllm_kunlun.ops.sampling.topk_topp import KunlunTopKTopPSampler

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    batch, vocab = args.batch, args.vocab
    g = torch.Generator(device=device).manual_seed(args.seed)
    logits = torch.randn(batch, vocab, device=device, generator=g)
    ours = KunlunTopKTopPSampler()
    native = TopKTopPSampler()
    kernels = ours.kernels(device)
    wanted = set(selected_modes(args.modes))
    read_bytes = batch * vocab * logits.element_size()
    rows = []
    for name, k, p, seeded in MODES:
        if wanted and name not in wanted:
            continue
        kt = (
            None
            if k is None
            else torch.full((batch,), k, dtype=torch.int32, device=device)
        )
        pt = None if p is None else torch.full((batch,), p, device=device)
        result: dict[str, Any] = {"mode": name}
        fns: dict[str, Callable[[torch.Tensor], Any]] = {"read": _row_max}
        for label, sampler in (
            ("ours", ours.forward),
            ("native", native.forward_native),
        ):
            gens = generators(seeded, batch, device, args.seed)
            fns[label] = lambda x, s=sampler, g=gens, kt=kt, pt=pt: s(x, g, kt, pt)[0]
        seconds = time_pair(fns, logits, args.iters, args.warmup)
        for label, (sec, cpu) in seconds.items():
            result[f"{label}_ms"] = sec * 1e3
            result[f"{label}_cpu_ms"] = cpu * 1e3
            result[f"{label}_gbps"] = read_bytes / sec / 1e9
        result["speedup"] = result["native_ms"] / result["ours_ms"]
        result["ours_reads"] = result["ours_ms"] / result["read_ms"]
        result["ours_cpu_reads"] = result["ours_cpu_ms"] / max(
            result["read_cpu_ms"], 1e-6
        )
        rows.append(result)
        print(
            f"  {name:22s} ours {result['ours_ms']:9.1f} ms  native "
            f"{result['native_ms']:9.1f} ms  x{result['speedup']:.2f}  one read "
            f"{result['read_ms']:.1f} ms",
            file=sys.stderr,
            flush=True,
        )
    return {
        "batch": batch,
        "vocab": vocab,
        "dtype": "float32",
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else "cpu",
        "threads": torch.get_num_threads(),
        "iters": args.iters,
        "torch": torch.__version__,
        "vllm": vllm.__version__,
        "ours_kernels": f"{kernels.name} ({kernels.reason})",
        "results": rows,
    }


def markdown(report: dict[str, Any]) -> str:
    head = (
        f"batch {report['batch']} x vocab {report['vocab']} {report['dtype']} logits, "
        f"{report['device']} ({report['device_name']}, {report['threads']} threads), "
        f"median of {report['iters']}; torch {report['torch']}, vLLM {report['vllm']}; "
        f"ours = {report['ours_kernels']}"
    )
    lines = [
        head,
        "",
        "| mode | ours ms/step | x one read | vLLM native ms/step | speed-up | "
        "one read ms | ours CPU ms | x one read (CPU) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['mode']} | {r['ours_ms']:.1f} | {r['ours_reads']:.1f} | "
            f"{r['native_ms']:.1f} | {r['speedup']:.2f}x | {r['read_ms']:.1f} | "
            f"{r['ours_cpu_ms']:.1f} | {r['ours_cpu_reads']:.1f} |"
        )
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> Path:
    """ms per mode, ours / vLLM native / one read as grouped bars (log scale: native
    is 20-300x ours), from the report ``markdown`` prints."""
    plots = load_plots()
    ours, native, read = "ours ms/step", "vLLM native ms/step", "one read ms"
    table = plots.Table(
        title=(
            f"sampler: batch {report['batch']} x vocab {report['vocab']}, "
            f"{report['device_name']}, {report['threads']} thread(s), median of "
            f"{report['iters']}; ours = {report['ours_kernels'].split(' (')[0]}"
        ),
        columns=["mode", ours, native, read],
        rows=[
            [r["mode"], r["ours_ms"], r["native_ms"], r["read_ms"]]
            for r in report["results"]
        ],
    )
    panel = plots.Panel(
        [ours, native, read],
        "ms per step (log)",
        log=True,
        labels={ours: "ours", native: "vLLM native", read: "one read"},
    )
    return Path(plots.draw(path, table, [panel]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Keep stdout to the table: vLLM logs INFO lines to stdout by default.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    report = run(args)
    print(markdown(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.plot:
        plot(report, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
