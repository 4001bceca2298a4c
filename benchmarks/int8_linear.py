"""Int8 linear probe: the plugin's portable W8A8 kernel vs a float matmul, same shapes.

Times, on the same activations in the same run, one linear layer computed by

* ours: ``ops.int8_mm_portable.int8_linear`` (per-token dynamic int8 activations, the
  exact int8 product the one-time probe chose for the device, vLLM's epilogue), and
* float: ``torch.nn.functional.linear`` with the weight in the activations' dtype,

for the per-card shapes of the log's model (Qwen3.5-27B at TP 8: column-parallel
layers split their outputs by 8, row-parallel ones their inputs) and a few token
counts. Reported: median ms per call, ours / float (a ratio above 1 is slower), and the
weight bytes each keeps. Then, from the same shape table (``checks/weights.py``), the
weight memory int8 saves per decoder layer and for the whole model.

    python benchmarks/int8_linear.py                        # CPU, float32 activations
    python benchmarks/int8_linear.py --dtype bfloat16 --tokens 1,64 --json out.json
    python benchmarks/int8_linear.py --plot int8.png        # and a picture (matplotlib)

Calls alternate between the two, so a change in machine load affects both. On CUDA every
call is synchronised before and after. On Kunlun the vendor kernels serve W8A8 layers;
this probe measures the portable path (host emulation, CI, fallbacks).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.timing import interleaved_medians  # noqa: E402
from vllm_kunlun.checks.weights import (  # noqa: E402
    QWEN3_5_27B,
    int8_linear_bytes,
    linear_layers,
)
from vllm_kunlun.ops.int8 import portable  # noqa: E402

TP = 8
# (name, out, in) per card at TP 8; column-parallel: out / 8, row-parallel: in / 8.
SHAPES = {
    "mlp.gate_up_proj": (2 * 17408 // TP, 5120),
    "mlp.down_proj": (5120, 17408 // TP),
    "self_attn.qkv_proj": ((12288 + 2 * 1024) // TP, 5120),
    "linear_attn.in_proj_qkv": (10240 // TP, 5120),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens", default="1,32,256", help="comma-separated token counts (M)"
    )
    names = ", ".join(map(repr, SHAPES))
    parser.add_argument(
        "--shapes", default="", help=f"comma-separated subset of shape names: {names}"
    )
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--plot",
        type=Path,
        help="also draw ms per layer and token count (ours, float) into this PNG; "
        "needs matplotlib (pip install 'vllm-kunlun[bench]')",
    )
    args = parser.parse_args(argv)
    unknown = [s for s in _names(args.shapes) if s not in SHAPES]
    if unknown:
        parser.error(
            f"unknown shape(s) {', '.join(map(repr, unknown))}; valid shapes: {names}"
        )
    if not all(t.isdigit() and int(t) > 0 for t in _names(args.tokens)):
        parser.error(
            f"--tokens {args.tokens!r}: expected positive integers separated by commas"
        )
    if args.plot and (error := load_plots().problem(args.plot)):
        parser.error(error)
    return args


def load_plots() -> ModuleType:
    """benchmarks/plots.py, loaded only for --plot: it needs matplotlib, an extra."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import plots

    return plots


def _names(spec: str) -> list[str]:
    return [s.strip() for s in spec.split(",") if s.strip()]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory_table() -> dict[str, Any]:
    """Weight bytes per decoder layer, bf16 vs int8 + float32 channel scales."""
    layers = linear_layers(QWEN3_5_27B)
    assert layers is not None
    kinds: dict[str, dict[str, int]] = {}
    for kind, prefixes in (
        ("full attention layer", ("self_attn.", "mlp.")),
        ("Gated DeltaNet layer", ("linear_attn.", "mlp.")),
    ):
        chosen = [lin for lin in layers if lin.name.startswith(prefixes)]
        bf16 = sum(2 * lin.out * lin.inp for lin in chosen)
        int8 = sum(int8_linear_bytes(lin) // lin.layers for lin in chosen)
        kinds[kind] = {"bf16": bf16, "int8": int8, "saved": bf16 - int8}
    total_bf16 = sum(2 * lin.params for lin in layers)
    total_int8 = sum(int8_linear_bytes(lin) for lin in layers)
    return {
        "per_layer": kinds,
        "linear_total": {
            "bf16": total_bf16,
            "int8": total_int8,
            "saved": total_bf16 - total_int8,
            "saved_per_card_tp8": (total_bf16 - total_int8) // TP,
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    names = _names(args.shapes) or list(SHAPES)
    rows = []
    for name in names:
        n, k = SHAPES[name]
        w_float = (torch.randn(n, k, generator=gen) / k**0.5).to(device, dtype)
        w_q, w_scale = quantize_weight_rows(w_float)
        for m in (int(t) for t in _names(args.tokens)):
            x = torch.randn(m, k, generator=gen).to(device, dtype)
            med = interleaved_medians(
                {
                    "ours": lambda x=x, w_q=w_q, w_scale=w_scale: portable.int8_linear(
                        x, w_q, w_scale
                    ),
                    "float": lambda x=x, w_float=w_float: torch.nn.functional.linear(
                        x, w_float
                    ),
                },
                args.iters,
                args.warmup,
                sync=lambda: _sync(device),
            )
            rows.append(
                {
                    "shape": name,
                    "tokens": m,
                    "out": n,
                    "in": k,
                    "ours_ms": med["ours"] * 1e3,
                    "float_ms": med["float"] * 1e3,
                    "ratio": med["ours"] / med["float"],
                    "product": portable.exact_int8_matmul(device).chosen(
                        x.to(torch.int8), w_q
                    ),
                    "weight_bytes_ours": w_q.numel() + 4 * n,
                    "weight_bytes_float": w_float.numel() * w_float.element_size(),
                }
            )
    return {
        "device": str(device),
        "dtype": args.dtype,
        "iters": args.iters,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rows": rows,
        "memory": memory_table(),
    }


def quantize_weight_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8 (absmax / 127; the scale convention does not
    change the timing)."""
    wf = w.float()
    scale = wf.abs().amax(dim=1) / 127.0
    return (wf / scale.unsqueeze(1)).round().clamp(-128, 127).to(torch.int8), scale


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"int8 linear, {report['device']}, {report['dtype']} activations, median of "
        f"{report['iters']}; torch {report['torch']}, {report['threads']} threads",
        "",
        "| layer (per card, TP 8) | out x in | tokens | ours ms | float ms | ours / float "
        "| weight MiB ours / float | exact product |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['shape']} | {r['out']} x {r['in']} | {r['tokens']} | "
            f"{r['ours_ms']:.2f} | {r['float_ms']:.2f} | {r['ratio']:.2f} | "
            f"{r['weight_bytes_ours'] / 2**20:.1f} / "
            f"{r['weight_bytes_float'] / 2**20:.1f} | {r['product']} |"
        )
    mem = report["memory"]
    lines += [
        "",
        "Weight memory of Qwen3.5-27B's linear layers (bf16 vs int8 + float32 channel "
        "scales; checks/weights.py):",
        "",
        "| | bf16 | W8A8 | saved |",
        "|---|---:|---:|---:|",
    ]
    for kind, v in mem["per_layer"].items():
        lines.append(
            f"| one {kind} | {v['bf16'] / 2**20:.1f} MiB | {v['int8'] / 2**20:.1f} MiB "
            f"| {v['saved'] / 2**20:.1f} MiB |"
        )
    t = mem["linear_total"]
    lines.append(
        f"| all 64 layers | {_gib(t['bf16'])} | {_gib(t['int8'])} | {_gib(t['saved'])} "
        f"({_gib(t['saved_per_card_tp8'])} per card at TP 8) |"
    )
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> Path:
    """ms per layer and token count, ours against float (log scale: the token counts
    span 256x), the numbers ``markdown`` prints."""
    plots = load_plots()
    ours, flt = "ours ms", "float ms"
    table = plots.Table(
        title=(
            f"int8 linear (per card, TP 8), {report['device']}, {report['dtype']} "
            f"activations, {report['threads']} threads, median of {report['iters']}"
        ),
        columns=["layer x tokens", ours, flt],
        rows=[
            [f"{r['shape']} x {r['tokens']}", r["ours_ms"], r["float_ms"]]
            for r in report["rows"]
        ],
    )
    labels = {ours: "ours (int8)", flt: "float matmul"}
    panel = plots.Panel([ours, flt], "ms per call (log)", log=True, labels=labels)
    return Path(plots.draw(path, table, [panel]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(markdown(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    if args.plot:
        plot(report, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
