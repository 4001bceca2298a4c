"""The doctor's ``patchset`` check: the patch_torch251 file patch set for the installed vLLM / torch pair.

The log's verification after the rollback was "patch_torch251: 11 applied | 0 failed";
here the patch engine (vllm_kunlun.file_patches.engine) reports each patch of the set as
applied, not applied, or drifted (the file matches neither the pre-patch nor the patched
sha256 of the manifest: edited by hand or by another tool). The torch-level runtime
fixes that stand in for file patches (``schema_pep585``, ``torch_wrap_triton``) are
judged beside it (needed or not on this torch, and whether they can apply), and every
runtime patch of ``patching/registry.py`` is listed in the details.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_kunlun.checks.finding import Context, Finding
from vllm_kunlun.versions import REINSTALL_VLLM, label

Summary = Callable[[], tuple[int, int, dict[str, str]]]
RuntimeFixes = Callable[[], dict[str, str]]


def _engine_summary() -> tuple[int, int, dict[str, str]]:
    from vllm_kunlun.file_patches import engine

    return engine.status_summary()


def _runtime_fixes() -> dict[str, str]:
    from vllm_kunlun.patching.registry import torch_fix_states

    return torch_fix_states()


def _with_runtime_fixes(finding: Finding, fixes: dict[str, str]) -> Finding:
    """Name the runtime fixes in the cause; a fix that cannot apply is a warning.

    Every runtime patch of the registry goes into the details, with its state."""
    from vllm_kunlun.patching.registry import describe

    finding.details["runtime_fixes"] = fixes
    finding.details["runtime_patches"] = describe()
    broken = {n: s for n, s in fixes.items() if s.startswith(("CANNOT", "OFF"))}
    needed = [n for n, s in fixes.items() if s.startswith(("needed", "applied"))]
    if needed:
        finding.cause += (
            f"; runtime fixes the platform applies at start: {', '.join(needed)}"
        )
    if broken:
        finding.cause += "; " + "; ".join(f"{n}: {s}" for n, s in broken.items())
        if finding.status in ("ok", "skip"):
            finding.status = "warn"
            finding.fix = (
                f"install the validated {label('torch')} / {label('vllm')}, and leave "
                "VLLM_KUNLUN_SCHEMA_FIX at its default (1)"
            )
    return finding


def check_patchset(
    ctx: Context,
    summary: Summary = _engine_summary,
    runtime_fixes: RuntimeFixes = _runtime_fixes,
) -> Finding:
    return _with_runtime_fixes(_check_files(summary), runtime_fixes())


def _check_files(summary: Summary) -> Finding:
    from vllm_kunlun.file_patches.errors import PairMismatch, PatchError

    try:
        applied, total, states = summary()
    except PairMismatch as exc:
        return Finding(
            "patchset",
            "skip",
            f"the set does not apply to this stack: {exc.reason}",
            exc.fix,
            {"error": exc.to_json()},
        )
    except PatchError as exc:
        return Finding(
            "patchset", "fail", exc.reason, exc.fix, {"error": exc.to_json()}
        )
    details: dict[str, Any] = {"applied": applied, "total": total, "patches": states}
    drifted = sorted(p for p, s in states.items() if s == "drifted")
    missing = sorted(p for p, s in states.items() if s == "not applied")
    if drifted:
        return Finding(
            "patchset",
            "fail",
            f"patch_torch251 {applied}/{total} applied; drifted (files edited outside "
            f"the engine): {', '.join(drifted)}",
            f"reinstall the pristine files with `{REINSTALL_VLLM}`, then run "
            "`vllm-kunlun patch apply`",
            details,
        )
    if missing:
        listed = ", ".join(missing[:3]) + (
            f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
        )
        return Finding(
            "patchset",
            "warn",
            f"patch_torch251 {applied}/{total} applied; not applied: {listed} "
            "(vLLM 0.15.1 on torch 2.5.1 needs them for torch.compile and structured "
            "output)",
            "vllm-kunlun patch apply",
            details,
        )
    return Finding(
        "patchset", "ok", f"patch_torch251 {applied}/{total} applied", details=details
    )
