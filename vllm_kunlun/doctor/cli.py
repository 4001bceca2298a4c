"""``vllm-kunlun doctor``: run every preflight check and print the findings."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("doctor", help="preflight checks: what is wrong and the fix")
    p.add_argument("--model", help="model directory the engine will load")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vllm_kunlun.doctor.checks import CHECKS
    from vllm_kunlun.doctor.finding import Context, run_checks
    from vllm_kunlun.doctor.report import exit_code, render_json, render_table

    ctx = Context(
        model=args.model,
        tensor_parallel_size=args.tensor_parallel_size,
        max_num_seqs=args.max_num_seqs,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    findings = run_checks(CHECKS, ctx)
    if args.json:
        print(render_json(findings))
    else:
        print(render_table(findings, colour=sys.stdout.isatty()))
    return exit_code(findings)
