"""Human (table) and JSON renderings of the doctor's findings."""

from __future__ import annotations

import json
from collections.abc import Sequence

from vllm_kunlun.doctor.finding import Finding

JSON_SCHEMA_VERSION = 1

_COLOURS = {"ok": "\033[32m", "warn": "\033[33m", "fail": "\033[31m"}
_RESET = "\033[0m"


def exit_code(findings: Sequence[Finding]) -> int:
    return 1 if any(f.status == "fail" for f in findings) else 0


def render_json(findings: Sequence[Finding]) -> str:
    return json.dumps(
        {
            "schema_version": JSON_SCHEMA_VERSION,
            "ok": exit_code(findings) == 0,
            "findings": [f.to_json() for f in findings],
        },
        indent=2,
        sort_keys=True,
        default=str,
    )


def render_table(findings: Sequence[Finding], colour: bool = False) -> str:
    width = max((len(f.check) for f in findings), default=5)
    lines = []
    for f in findings:
        status = f.status.upper().ljust(4)
        if colour:
            status = f"{_COLOURS[f.status]}{status}{_RESET}"
        lines.append(f"{status}  {f.check.ljust(width)}  {f.cause}")
        if f.fix and f.status != "ok":
            lines.append(f"{'':4}  {'':{width}}  fix: {f.fix}")
    n_fail = sum(f.status == "fail" for f in findings)
    n_warn = sum(f.status == "warn" for f in findings)
    lines.append(f"{len(findings)} checks: {n_fail} failed, {n_warn} warnings")
    return "\n".join(lines)
