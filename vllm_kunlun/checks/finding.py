"""A check's result, what the checks are told, and the runner that turns a crashing
check into a failed finding (the doctor itself never crashes on a broken environment:
a broken environment is exactly what it is for)."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from vllm_kunlun.envs import EnvVarError

Status = Literal["ok", "warn", "fail", "skip"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail", "skip")


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
    """What the user told the doctor; checks read only what they need.

    Everything a check would otherwise take from the machine (``/dev``, the working
    directory, the device memory, the source checkout) is a field, so that tests can
    build a healthy and a broken environment in a temporary directory.
    """

    model: str | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    """vLLM's --distributed-executor-backend; None: vLLM's choice."""
    max_num_seqs: int = 256
    gpu_memory_utilization: float = 0.9
    mamba_cache_dtype: str = "auto"
    """vLLM's --mamba-cache-dtype: dtype of the linear-attention (GDN) conv state."""
    mamba_ssm_cache_dtype: str = "auto"
    """vLLM's --mamba-ssm-cache-dtype: the GDN recurrent state's dtype; 'auto': the
    checkpoint's ``mamba_ssm_dtype``, else the conv state's (ops/gdn/state_dtype.py)."""
    num_speculative_tokens: int = 0
    """``num_speculative_tokens`` of --speculative-config (MTP); 0: none."""
    max_loras: int = 0
    """vLLM's --max-loras with --enable-lora; 0: LoRA off."""
    max_lora_rank: int = 16
    """vLLM's --max-lora-rank (its default 16)."""
    dev_root: str = "/dev"
    cwd: str = field(default_factory=os.getcwd)
    """Directory a relative ``--model`` is resolved against (vLLM uses the cwd)."""
    device_memory_bytes: int | None = None
    """Memory of one card; None: ask torch.cuda, else assume a P800."""
    reserve_gib: float | None = None
    """Runtime reserve beside the KV cache; None: the budget module's default."""
    source_root: str | None = None
    """vllm-kunlun source checkout to compare with the installed package; None:
    look for one at and above ``cwd``."""


Check = Callable[[Context], Finding]


def crashed(name: str, exc: BaseException) -> Finding:
    if isinstance(exc, EnvVarError):  # not a bug: the environment finding says why
        return Finding(
            check=name,
            status="fail",
            cause=f"cannot run with a malformed variable: {exc}",
            fix="fix the variable (see the environment finding)",
        )
    return Finding(
        check=name,
        status="fail",
        cause=f"the check itself crashed: {type(exc).__name__}: {exc}",
        fix="report this as a vllm-kunlun bug, with the traceback in the details",
        details={"traceback": traceback.format_exc(limit=8)},
    )


def run_checks(checks: Sequence[tuple[str, Check]], ctx: Context) -> list[Finding]:
    findings = []
    for name, check in checks:
        try:
            finding = check(ctx)
            if not isinstance(finding, Finding) or finding.status not in STATUSES:
                raise TypeError(f"check returned {finding!r}, not a Finding")
            finding.check = name
        except Exception as exc:
            finding = crashed(name, exc)
        findings.append(finding)
    return findings
