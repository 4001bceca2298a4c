"""Human (table) and JSON renderings of the doctor's findings.

The JSON document is a stable interface, described by ``schema.json`` beside this module
(and docs/doctor.md): a change that removes or renames a field bumps
``JSON_SCHEMA_VERSION``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

from vllm_kunlun.checks.finding import Finding
from vllm_kunlun.versions import __version__

JSON_SCHEMA_VERSION = 1

_COLOURS = {"ok": "\033[32m", "warn": "\033[33m", "fail": "\033[31m", "skip": "\033[2m"}
_RESET = "\033[0m"


def exit_code(findings: Sequence[Finding]) -> int:
    return 1 if any(f.status == "fail" for f in findings) else 0


def json_schema() -> dict[str, Any]:
    text = resources.files("vllm_kunlun.doctor").joinpath("schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


def to_document(findings: Sequence[Finding]) -> dict[str, Any]:
    counts = {
        s: sum(f.status == s for f in findings) for s in ("ok", "warn", "fail", "skip")
    }
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "vllm_kunlun_version": __version__,
        "ok": exit_code(findings) == 0,
        "exit_code": exit_code(findings),
        "counts": counts,
        "findings": [f.to_json() for f in findings],
    }


def render_json(findings: Sequence[Finding]) -> str:
    # default=str: details may hold paths or versions objects; the schema says
    # details values are JSON values, and str() keeps that promise.
    return json.dumps(to_document(findings), indent=2, sort_keys=True, default=str)


def render_table(findings: Sequence[Finding], colour: bool = False) -> str:
    """One line per check (status, name, cause), then ``fix:`` and, for the budget, the
    arithmetic. Colour only when asked (the CLI asks when stdout is a TTY)."""
    width = max((len(f.check) for f in findings), default=5)
    pad = " " * (4 + 2 + width + 2)
    lines = []
    for f in findings:
        status = f.status.upper().ljust(4)
        if colour:
            status = f"{_COLOURS[f.status]}{status}{_RESET}"
        lines.append(f"{status}  {f.check.ljust(width)}  {f.cause}")
        if f.fix and f.status in ("warn", "fail"):
            lines.append(f"{pad}fix: {f.fix}")
        arithmetic = f.details.get("arithmetic")
        if isinstance(arithmetic, list):
            lines += [f"{pad}  {line}" for line in arithmetic]
    n_fail = sum(f.status == "fail" for f in findings)
    n_warn = sum(f.status == "warn" for f in findings)
    n_skip = sum(f.status == "skip" for f in findings)
    lines.append(
        f"{len(findings)} checks: {n_fail} failed, {n_warn} warnings, {n_skip} skipped"
    )
    return "\n".join(lines)
