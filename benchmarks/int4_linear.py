"""Weight-only 4-bit linear probe: the plugin's portable W4A16 kernel vs a float matmul
vs the portable W8A8 kernel, same shapes, same run.

Times, on the same activations, one linear layer computed by

* int4: ``ops/int4/portable.wna16_linear`` (4-bit weights packed as compressed-tensors
  stores them, group 128 with zero points, dequantized chunk by chunk),
* float: ``torch.nn.functional.linear`` with the weight in the activations' dtype,
* w8a8: ``ops/int8/portable.int8_linear`` (per-channel int8 weights, per-token int8
  activations),

for per-card shapes of Qwen3.5-27B at TP 8 and Qwen3-32B(-AWQ) at TP 2, and a few token
counts. Reported: median ms per call and the ratios to float (above 1 is slower), the
weight bytes each layer keeps (read once per step: per decode token at batch 1), the
largest float weight the int4 kernel holds at once (one chunk) against the layer's
whole float weight, and from ``checks/weights.py`` the memory 4-bit saves for both
whole models.

    python benchmarks/int4_linear.py                        # CPU, float32 activations
    python benchmarks/int4_linear.py --dtype bfloat16 --tokens 1,64 --json out.json

Calls alternate between the three, so a change in machine load affects all. On Kunlun
the vendor ``gptq_gemm`` serves symmetric layers; this probe measures the portable path.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.timing import interleaved_medians  # noqa: E402
from vllm_kunlun.checks.weights import (  # noqa: E402
    QWEN3_5_27B,
    WeightOnly,
    int8_linear_bytes,
    linear_layers,
    weight_only_linear_bytes,
)
from vllm_kunlun.ops.int4 import portable as int4  # noqa: E402
from vllm_kunlun.ops.int8 import portable as int8  # noqa: E402

GROUP = 128
# (name, out, in) per card: column-parallel layers split their outputs, row-parallel
# ones their inputs.
SHAPES = {
    "27b-tp8.mlp.gate_up_proj": (2 * 17408 // 8, 5120),
    "27b-tp8.mlp.down_proj": (5120, 17408 // 8),
    "32b-tp2.self_attn.qkv_proj": ((8192 + 2 * 1024) // 2, 5120),
    "32b-tp2.mlp.gate_up_proj": (2 * 25600 // 2, 5120),
    "32b-tp2.mlp.down_proj": (5120, 25600 // 2),
}
QWEN3_32B: dict[str, Any] = {
    "model_type": "qwen3",
    "hidden_size": 5120,
    "intermediate_size": 25600,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
}
AWQ_LIKE = WeightOnly("W4A16", 4, GROUP, True, False, (), ())


def _names(spec: str) -> list[str]:
    return [s.strip() for s in spec.split(",") if s.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,32", help="comma-separated token counts")
    names = ", ".join(map(repr, SHAPES))
    parser.add_argument("--shapes", default="", help=f"subset of: {names}")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    unknown = [s for s in _names(args.shapes) if s not in SHAPES]
    if unknown:
        parser.error(
            f"unknown shape(s) {', '.join(map(repr, unknown))}; valid: {names}"
        )
    if not all(t.isdigit() and int(t) > 0 for t in _names(args.tokens)):
        parser.error(f"--tokens {args.tokens!r}: expected positive integers")
    return args


def quantize_int4(
    w: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Min-max 4-bit with zero points per group of 128 (the timing does not depend on
    the rounding rule): packed [N, K/8], scales [N, G], zero points [N, G]."""
    n, k = w.shape
    wg = w.float().reshape(n, k // GROUP, GROUP)
    lo, hi = wg.amin(-1), wg.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-8)
    zero = (-lo / scale).round().clamp(0, 15)
    q = (wg / scale.unsqueeze(-1)).round().add(zero.unsqueeze(-1)).clamp(0, 15)
    return int4.pack_cols(q.reshape(n, k), 4), scale.to(w.dtype), zero.to(torch.uint8)


def timed(
    x: torch.Tensor,
    w: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    w8: torch.Tensor,
    w8_scale: torch.Tensor,
) -> dict[str, Callable[[], torch.Tensor]]:
    """The three computations of one layer on ``x``."""
    return {
        "int4": lambda: int4.wna16_linear(x, packed, scales, zeros, 4, GROUP),
        "float": lambda: torch.nn.functional.linear(x, w),
        "w8a8": lambda: int8.int8_linear(x, w8, w8_scale),
    }


def model_memory() -> dict[str, dict[str, int]]:
    """Linear-layer weight bytes: bf16, W8A8 (int8 + float32 channel scales), W4A16
    (4-bit + bf16 group-128 scales + zero points)."""
    out = {}
    for name, config in (("Qwen3.5-27B", QWEN3_5_27B), ("Qwen3-32B", QWEN3_32B)):
        layers = linear_layers(config)
        assert layers is not None
        out[name] = {
            "bf16": sum(2 * lin.params for lin in layers),
            "w8a8": sum(int8_linear_bytes(lin) for lin in layers),
            "w4a16": sum(weight_only_linear_bytes(lin, AWQ_LIKE, 2) for lin in layers),
        }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name in _names(args.shapes) or list(SHAPES):
        n, k = SHAPES[name]
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
        packed, scales, zeros = quantize_int4(w)
        wf = w.float()
        w8_scale = wf.abs().amax(dim=1) / 127.0
        w8 = (wf / w8_scale.unsqueeze(1)).round().clamp(-128, 127).to(torch.int8)
        for m in (int(t) for t in _names(args.tokens)):
            x = torch.randn(m, k, generator=gen).to(dtype)
            med = interleaved_medians(
                timed(x, w, packed, scales, zeros, w8, w8_scale),
                args.iters,
                args.warmup,
            )
            chunk = int4.chunk_columns(n, k, GROUP, 4)
            rows.append(
                {
                    "shape": name,
                    "tokens": m,
                    "out": n,
                    "in": k,
                    **{f"{p}_ms": med[p] * 1e3 for p in med},
                    "int4_vs_float": med["int4"] / med["float"],
                    "int4_vs_w8a8": med["int4"] / med["w8a8"],
                    "weight_bytes": {
                        "int4": packed.numel() * 4
                        + scales.numel() * scales.element_size()
                        + zeros.numel() // 2,
                        "w8a8": w8.numel() + 4 * n,
                        "float": w.numel() * w.element_size(),
                    },
                    "int4_chunk_float_bytes": 4 * n * chunk,
                    "layer_float32_bytes": 4 * n * k,
                }
            )
    return {
        "dtype": args.dtype,
        "iters": args.iters,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rows": rows,
        "models": model_memory(),
    }


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"weight-only int4 linear (portable), CPU, {report['dtype']} activations, "
        f"median of {report['iters']}; torch {report['torch']}, "
        f"{report['threads']} threads",
        "",
        "| layer (per card) | out x in | tokens | int4 ms | float ms | w8a8 ms | "
        "int4 / float | int4 / w8a8 | weight MiB int4 / w8a8 / float (bytes per "
        "token at batch 1) | int4 float chunk / whole layer MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in report["rows"]:
        b = r["weight_bytes"]
        lines.append(
            f"| {r['shape']} | {r['out']} x {r['in']} | {r['tokens']} | "
            f"{r['int4_ms']:.2f} | {r['float_ms']:.2f} | {r['w8a8_ms']:.2f} | "
            f"{r['int4_vs_float']:.2f} | {r['int4_vs_w8a8']:.2f} | "
            f"{_mib(b['int4'])} / {_mib(b['w8a8'])} / {_mib(b['float'])} | "
            f"{_mib(r['int4_chunk_float_bytes'])} / {_mib(r['layer_float32_bytes'])} |"
        )
    lines += [
        "",
        "Linear-layer weights of the whole model (checks/weights.py; W4A16: group 128, "
        "bf16 scales, zero points):",
        "",
        "| model | bf16 GiB | W8A8 GiB | W4A16 GiB | saved vs bf16 | saved vs W8A8 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for model, v in report["models"].items():
        g = 1 << 30
        lines.append(
            f"| {model} | {v['bf16'] / g:.2f} | {v['w8a8'] / g:.2f} | "
            f"{v['w4a16'] / g:.2f} | {(v['bf16'] - v['w4a16']) / g:.2f} | "
            f"{(v['w8a8'] - v['w4a16']) / g:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(markdown(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
