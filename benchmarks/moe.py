"""MoE probe: the plugin's portable grouped experts vs a dense MLP and a per-token loop.

Times, on the same activations in the same run, one routed MoE layer at Qwen3.5-35B-A3B's
shape (hidden 2048, 256 experts, top-8, expert width 512; the shared expert left out of
every side) computed by

* grouped: ``ops/moe/portable.moe_forward`` (router, softmax top-k, the (token, slot)
  pairs sorted by expert, one matmul pair per active expert, one ``index_add_``);
* dense: a dense SiLU MLP with the same active parameters, hidden 2048 -> 8 x 512 ->
  2048 (the same FLOPs per token as the experts, no router): what the routed layer
  would cost if it read only the weights a token uses;
* loop: the router and routing, then a Python loop over tokens and their top-k experts
  (one matrix-vector pair per (token, expert)), the naive way to write the layer;
* vllm: vLLM's own ``FusedMoE`` layer as the plugin serves it
  (``ops/moe/fused_moe_method.experts_forward`` on the layer's attributes: vLLM's
  routing from the router logits, the same grouped kernel), router included;
* floor: one read of the weights the tokens' experts use (a sum over each active
  expert's w13 and w2), the memory traffic no kernel of the layer can avoid.

Qwen3-30B-A3B's shape (vLLM's layer; the issue's goal there: vllm / floor at most 1.5 at
1, 16 and 256 tokens): ``--experts 128 --inter 768``.

Reported: median ms per call, grouped / dense (the issue's goal: at most 2 at 256
tokens), loop / grouped, vllm / floor, vllm / dense, the experts the tokens activated, and the largest difference
between the grouped and the loop outputs (both compute the same thing).

    python benchmarks/moe.py                          # 1, 16, 256 tokens, float32, CPU
    python benchmarks/moe.py --dtype bf16 --rounds 3 --json moe.json
    python benchmarks/moe.py --plot moe.png           # and a picture (matplotlib)

Calls alternate (grouped, dense, loop, grouped, ...), so a change in machine load affects
all three. The float32 weights of the 256 experts take 3 GiB (bf16: 1.5 GiB).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.timing import interleaved_medians  # noqa: E402
from vllm_kunlun.ops.moe import portable  # noqa: E402

# Qwen3.5-35B-A3B's MoE layer (its config.json: hidden_size, num_experts,
# num_experts_per_tok, moe_intermediate_size).
HIDDEN, EXPERTS, TOP_K, INTER = 2048, 256, 8, 512
DTYPES = {"float32": torch.float32, "bf16": torch.bfloat16}
PATHS = ("grouped", "dense", "loop", "vllm", "floor")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens", default="1,16,256", help="comma-separated token counts"
    )
    parser.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
    parser.add_argument("--rounds", type=int, default=5, help="timed calls per path")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=HIDDEN)
    parser.add_argument("--experts", type=int, default=EXPERTS)
    parser.add_argument("--top-k", type=int, default=TOP_K)
    parser.add_argument("--inter", type=int, default=INTER, help="expert width")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="CPU threads for torch (default: torch's own choice)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--plot",
        type=Path,
        help="also draw ms per token count (grouped, dense, loop) into this PNG; "
        "needs matplotlib (pip install 'vllm-kunlun[bench]')",
    )
    args = parser.parse_args(argv)
    if not all(t.isdigit() and int(t) > 0 for t in _names(args.tokens)):
        parser.error(
            f"--tokens {args.tokens!r}: expected positive integers separated by commas"
        )
    if args.rounds < 1 or args.warmup < 0:
        parser.error("--rounds must be at least 1 and --warmup at least 0")
    if not 0 < args.top_k <= args.experts:
        parser.error(f"--top-k {args.top_k}: between 1 and --experts {args.experts}")
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


def dense_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(x, w1).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, w2)


def per_token_loop(
    x: torch.Tensor,
    router: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    top_k: int,
) -> torch.Tensor:
    weights, ids = portable.route(F.linear(x, router), top_k, True)
    out = torch.zeros_like(x)
    for t, experts in enumerate(ids.tolist()):
        for j, e in enumerate(experts):
            gate, up = F.linear(x[t], w13[e]).chunk(2)
            out[t] += (F.linear(F.silu(gate) * up, w2[e]) * weights[t, j]).to(x.dtype)
    return out


def vllm_layer(w: dict[str, torch.Tensor], top_k: int) -> Any:
    """The attributes of a vLLM ``FusedMoE`` layer (Qwen3-MoE's settings: softmax
    top-k, renormalised, silu) that the plugin's method reads."""
    from types import SimpleNamespace

    return SimpleNamespace(
        top_k=top_k,
        renormalize=True,
        use_grouped_topk=False,
        num_expert_group=None,
        topk_group=None,
        scoring_func="softmax",
        routed_scaling_factor=1.0,
        custom_routing_function=None,
        e_score_correction_bias=None,
        expert_map=None,
        activation="silu",
        apply_router_weight_on_input=False,
        w13_weight=w["w13"],
        w2_weight=w["w2"],
    )


def vllm_forward(x: torch.Tensor, w: dict[str, torch.Tensor], layer: Any) -> Any:
    from vllm_kunlun.ops.moe import fused_moe_method

    return fused_moe_method.experts_forward(layer, x, F.linear(x, w["router"]))


def floor_read(w13: torch.Tensor, w2: torch.Tensor, active: list[int]) -> float:
    """Read each active expert's weights once (the floor of the layer's traffic)."""
    total = 0.0
    for e in active:
        total += float(w13[e].sum()) + float(w2[e].sum())
    return total


def layer(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """Random weights of one MoE layer and of its dense equivalent, scaled so the
    activations stay of order one."""
    dtype = DTYPES[args.dtype]
    gen = torch.Generator().manual_seed(args.seed)
    h, e, i, k = args.hidden, args.experts, args.inter, args.top_k

    def rand(*shape: int, fan_in: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) / fan_in**0.5).to(dtype)

    return {
        "router": rand(e, h, fan_in=h),
        "w13": rand(e, 2 * i, h, fan_in=h),
        "w2": rand(e, h, i, fan_in=i),
        "dense_w1": rand(2 * k * i, h, fan_in=h),
        "dense_w2": rand(h, k * i, fan_in=k * i),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    w = layer(args)
    gen = torch.Generator().manual_seed(args.seed + 1)
    rows = []
    vlayer = vllm_layer(w, args.top_k)
    for t in (int(n) for n in _names(args.tokens)):
        x = torch.randn(t, args.hidden, generator=gen).to(DTYPES[args.dtype])
        _, ids = portable.route(F.linear(x, w["router"]), args.top_k, True)
        active = ids.unique().tolist()
        fns: dict[str, Callable[[], Any]] = {
            "grouped": lambda x=x: portable.moe_forward(
                x, w["router"], w["w13"], w["w2"], top_k=args.top_k, renormalize=True
            ),
            "dense": lambda x=x: dense_mlp(x, w["dense_w1"], w["dense_w2"]),
            "loop": lambda x=x: per_token_loop(
                x, w["router"], w["w13"], w["w2"], args.top_k
            ),
            "vllm": lambda x=x: vllm_forward(x, w, vlayer),
            "floor": lambda active=active: floor_read(w["w13"], w["w2"], active),
        }
        med = interleaved_medians(fns, args.rounds, args.warmup)
        grouped, looped, served = fns["grouped"](), fns["loop"](), fns["vllm"]()
        rows.append(
            {
                "tokens": t,
                **{f"{name}_ms": med[name] * 1e3 for name in PATHS},
                "grouped_over_dense": med["grouped"] / med["dense"],
                "loop_over_grouped": med["loop"] / med["grouped"],
                "vllm_over_floor": med["vllm"] / med["floor"],
                "vllm_over_dense": med["vllm"] / med["dense"],
                "active_experts": len(active),
                "max_diff_vs_loop": float((grouped - looped).abs().max()),
                "vllm_max_diff_vs_loop": float((served - looped).abs().max()),
            }
        )
    return {
        "date": time.strftime("%Y-%m-%d"),
        "shape": {
            "hidden": args.hidden,
            "experts": args.experts,
            "top_k": args.top_k,
            "inter": args.inter,
        },
        "dtype": args.dtype,
        "rounds": args.rounds,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rows": rows,
    }


def markdown(report: dict[str, Any]) -> str:
    s = report["shape"]
    lines = [
        f"MoE layer, hidden {s['hidden']}, {s['experts']} experts, top-{s['top_k']}, "
        f"expert width {s['inter']} (no shared expert), {report['dtype']}, CPU, "
        f"median of {report['rounds']}; torch {report['torch']}, "
        f"{report['threads']} threads",
        "",
        "| tokens | grouped ms | dense ms | loop ms | vllm ms | floor ms "
        "| grouped / dense | loop / grouped | vllm / floor | vllm / dense "
        "| active experts | max diff vs loop |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['tokens']} | {r['grouped_ms']:.2f} | {r['dense_ms']:.2f} | "
            f"{r['loop_ms']:.2f} | {r['vllm_ms']:.2f} | {r['floor_ms']:.2f} | "
            f"{r['grouped_over_dense']:.2f} | "
            f"{r['loop_over_grouped']:.2f} | {r['vllm_over_floor']:.2f} | "
            f"{r['vllm_over_dense']:.2f} | {r['active_experts']} | "
            f"{max(r['max_diff_vs_loop'], r['vllm_max_diff_vs_loop']):.1e} |"
        )
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> Path:
    """ms per token count, the three paths (log scale), the numbers ``markdown``
    prints."""
    plots = load_plots()
    s = report["shape"]
    columns = ["grouped ms", "dense ms", "loop ms", "vllm ms", "floor ms"]
    table = plots.Table(
        title=(
            f"MoE layer ({s['experts']} experts, top-{s['top_k']}, hidden {s['hidden']},"
            f" width {s['inter']}), {report['dtype']}, CPU, {report['threads']} "
            f"threads, median of {report['rounds']}"
        ),
        columns=["tokens", *columns],
        rows=[
            [r["tokens"], *(round(r[f"{p}_ms"], 2) for p in PATHS)]
            for r in report["rows"]
        ],
    )
    labels = {
        "grouped ms": "grouped experts (ours)",
        "dense ms": "dense MLP, same active params",
        "loop ms": "per-token loop",
        "vllm ms": "vLLM's FusedMoE on the plugin",
        "floor ms": "one read of the active experts",
    }
    panel = plots.Panel(columns, "ms per layer call (log)", log=True, labels=labels)
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
