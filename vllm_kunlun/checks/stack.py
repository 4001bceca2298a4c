"""The doctor's ``stack_versions`` check: the installed stack against the validated combination (vllm_kunlun.versions,
the one table the README, the doctor and the engine guard share)."""

from __future__ import annotations

from collections.abc import Callable

from vllm_kunlun.checks.finding import Context, Finding
from vllm_kunlun.hardware.device import probe_devices
from vllm_kunlun.versions import (
    VALIDATED,
    VersionCheck,
    check_component,
    installed_version,
)


def stack_status(
    installed: Callable[[str], str | None] = installed_version,
) -> list[VersionCheck]:
    return [check_component(c, installed(c.name)) for c in VALIDATED]


def _describe(c: VersionCheck) -> str:
    comp = c.component
    if c.installed is None:
        return (
            f"{comp.name} not installed (validated {comp.validated or 'vendor build'})"
        )
    text = f"{comp.name} {c.installed} (validated {comp.validated})"
    if comp.is_known_broken(c.installed):
        text += f": known broken, {comp.note}"
    return text


def check_stack_versions(
    ctx: Context,
    installed: Callable[[str], str | None] = installed_version,
    on_kunlun: bool | None = None,
) -> Finding:
    """A mismatch names the validated version and the command that installs it.

    Vendor wheels (kunlun_ops, xspeedgate_ops, cocopod, triton builds) are required only
    where a Kunlun driver reports devices; elsewhere their absence is informational.
    """
    checks = stack_status(installed)
    if on_kunlun is None:
        on_kunlun = probe_devices().count > 0
    details = {
        c.component.name: {
            "installed": c.installed,
            "validated": c.component.validated,
            "status": c.status,
            "known_broken": bool(c.installed)
            and c.component.is_known_broken(c.installed or ""),
        }
        for c in checks
    }
    bad = [c for c in checks if c.status in ("mismatch", "missing")]
    if on_kunlun:
        bad += [c for c in checks if c.status == "absent"]
    if not bad:
        absent = [c.component.name for c in checks if c.status == "absent"]
        cause = "every component matches the validated stack"
        if absent:
            cause += f" (vendor wheels not installed, not a Kunlun host: {', '.join(absent)})"
        return Finding("stack_versions", "ok", cause, details=details)
    return Finding(
        "stack_versions",
        "fail",
        "; ".join(_describe(c) for c in bad),
        "; ".join(c.component.install for c in bad),
        details,
    )
