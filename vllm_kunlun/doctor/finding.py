"""A check's result and the runner that turns a crashing check into a finding."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["ok", "warn", "fail"]


@dataclass
class Finding:
    check: str
    status: Status
    cause: str
    """One line: what is (or is not) wrong."""
    fix: str = ""
    """One line: the exact thing to do; empty when nothing needs doing."""
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Context:
    """What the user told the doctor; checks read only what they need."""

    model: str | None = None
    tensor_parallel_size: int = 1
    max_num_seqs: int = 256
    gpu_memory_utilization: float = 0.9
    dev_root: str = "/dev"


Check = Callable[[Context], Finding]


def run_checks(checks: Sequence[tuple[str, Check]], ctx: Context) -> list[Finding]:
    findings = []
    for name, check in checks:
        try:
            finding = check(ctx)
        except Exception as exc:
            finding = Finding(
                check=name,
                status="fail",
                cause=f"the check itself crashed: {type(exc).__name__}: {exc}",
                fix="report this as a vllm-kunlun bug with the details below",
                details={"traceback": traceback.format_exc(limit=5)},
            )
        findings.append(finding)
    return findings
