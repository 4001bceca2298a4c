"""``vllm-kunlun``: the plugin's command line (doctor, versions, ...)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def _cmd_versions(args: argparse.Namespace) -> int:
    from vllm_kunlun.versions import check_stack

    checks = check_stack()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": c.component.name,
                        "installed": c.installed,
                        "validated": c.component.validated,
                        "status": c.status,
                    }
                    for c in checks
                ],
                indent=2,
            )
        )
    else:
        for c in checks:
            mark = {"ok": "ok", "mismatch": "MISMATCH", "missing": "MISSING"}.get(
                c.status, "-"
            )
            print(f"{mark:9} {c.message}")
    bad = any(c.status in ("mismatch", "missing") for c in checks)
    return 1 if (args.strict and bad) else 0


def _cmd_doctor(args: argparse.Namespace) -> int:
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-kunlun", description="vLLM platform plugin for Kunlun P800 XPUs"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("doctor", help="preflight checks: what is wrong and the fix")
    p.add_argument("--model", help="model directory the engine will load")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser("versions", help="installed stack vs the validated combination")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--strict", action="store_true", help="exit 1 on a mismatch or missing component"
    )
    p.set_defaults(func=_cmd_versions)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
