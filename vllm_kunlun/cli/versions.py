"""``vllm-kunlun versions``: the installed stack against the validated combination."""

from __future__ import annotations

import argparse
import json
from typing import Any

from vllm_kunlun.cli.args import add_json_flag


def add_parser(sub: Any) -> None:
    p = sub.add_parser("versions", help="installed stack vs the validated combination")
    add_json_flag(p)
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 on a mismatch or missing component",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vllm_kunlun.versions import check_stack

    checks = check_stack()
    if args.json:
        rows = [
            {
                "name": c.component.name,
                "installed": c.installed,
                "validated": c.component.validated,
                "status": c.status,
            }
            for c in checks
        ]
        print(json.dumps(rows, indent=2))
    else:
        marks = {"ok": "ok", "mismatch": "MISMATCH", "missing": "MISSING"}
        for c in checks:
            print(f"{marks.get(c.status, '-'):9} {c.message}")
    bad = any(c.status in ("mismatch", "missing") for c in checks)
    return 1 if (args.strict and bad) else 0
