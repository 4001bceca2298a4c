"""The foundation checks: which platform vLLM resolves, devices, the stack."""

from __future__ import annotations

from vllm_kunlun.device import probe_devices
from vllm_kunlun.doctor.finding import Context, Finding
from vllm_kunlun.versions import check_stack


def check_platform(ctx: Context) -> Finding:
    from vllm.platforms import current_platform

    cls = type(current_platform)
    name = f"{cls.__module__}.{cls.__qualname__}"
    details = {"platform": name, "device_type": current_platform.device_type}
    if cls.__module__.startswith("vllm_kunlun"):
        return Finding("platform", "ok", f"vLLM resolves {name}", details=details)
    return Finding(
        "platform",
        "warn",
        f"vLLM resolves {name}, not the Kunlun platform",
        "on a Kunlun host check the devices finding; to force it set "
        "VLLM_KUNLUN_FORCE_PLATFORM=1",
        details,
    )


def check_device_count(ctx: Context) -> Finding:
    probe = probe_devices()
    details = {"count": probe.count, "source": probe.source}
    note = "torch.xpu.device_count() is an Intel stub on Kunlun (always 0), not the count"
    if probe.count > 0:
        return Finding(
            "device_count",
            "ok",
            f"{probe.count} Kunlun device(s) from {probe.source}; {note}",
            details=details,
        )
    return Finding(
        "device_count",
        "warn",
        f"no Kunlun device: {probe.source}",
        "on a Kunlun host install the vendor torch_xmlir wheel and map /dev/xpu* into "
        "the container",
        details,
    )


def check_stack_versions(ctx: Context) -> Finding:
    checks = check_stack()
    details = {
        c.component.name: {
            "installed": c.installed,
            "validated": c.component.validated,
            "status": c.status,
        }
        for c in checks
    }
    bad = [c for c in checks if c.status in ("mismatch", "missing")]
    if not bad:
        return Finding(
            "stack_versions", "ok", "every component matches the validated stack",
            details=details,
        )
    return Finding(
        "stack_versions",
        "fail",
        "; ".join(
            f"{c.component.name} {c.installed or 'missing'} "
            f"(validated {c.component.validated})"
            for c in bad
        ),
        "; ".join(c.component.install for c in bad),
        details,
    )


CHECKS = [
    ("platform", check_platform),
    ("device_count", check_device_count),
    ("stack_versions", check_stack_versions),
]
