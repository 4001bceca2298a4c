"""Checks ``platform`` and ``devices``: which platform vLLM resolves, and the Kunlun
devices this container sees (driver count vs ``/dev/xpuN`` + ``/dev/xpuctrl`` nodes)."""

from __future__ import annotations

from collections.abc import Callable

from vllm_kunlun.checks.finding import Context, Finding
from vllm_kunlun.hardware.device import (
    DeviceNodes,
    DeviceProbe,
    device_nodes,
    probe_devices,
)

XPU_STUB_NOTE = (
    "torch.xpu.device_count() is Intel's stub in Kunlun's torch build and reports 0 "
    "even when the cards work; the count to trust is torch_xmlir's"
)


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
        f"vLLM resolves {cls.__qualname__}, not the Kunlun platform",
        "on a Kunlun host see the devices finding; to force it set "
        "VLLM_KUNLUN_FORCE_PLATFORM=1",
        details,
    )


def _torch_xpu_count() -> int | None:
    """What ``torch.xpu.device_count()`` says, for the record (None: no torch.xpu)."""
    import torch

    xpu = getattr(torch, "xpu", None)
    if xpu is None:
        return None
    try:
        return int(xpu.device_count())
    except Exception:
        return None


def docker_device_flags(indices: list[int], ctrl: bool) -> str:
    flags = [f"--device=/dev/xpu{i}" for i in indices]
    if ctrl:
        flags.append("--device=/dev/xpuctrl")
    return " ".join(flags)


def check_devices(
    ctx: Context,
    probe: Callable[[], DeviceProbe] = probe_devices,
    xpu_count: Callable[[], int | None] = _torch_xpu_count,
) -> Finding:
    """Driver count vs device nodes; names the missing ``--device=`` flags.

    A container needs every ``/dev/xpuN`` and ``/dev/xpuctrl``: with a partial mapping
    the driver may still count the cards, and every collective then fails.
    """
    dev: DeviceProbe = probe()
    nodes: DeviceNodes = device_nodes(ctx.dev_root)
    details = {
        "driver_count": dev.count,
        "driver_source": dev.source,
        "dev_root": ctx.dev_root,
        "xpu_nodes": list(nodes.indices),
        "xpuctrl": nodes.has_ctrl,
        "torch_xpu_device_count": xpu_count(),
        "note": XPU_STUB_NOTE,
    }
    if dev.count == 0 and not nodes.indices and not nodes.has_ctrl:
        return Finding(
            "devices",
            "warn",
            f"no Kunlun device: no {ctx.dev_root}/xpu* nodes and {dev.source}",
            "on a Kunlun host install the vendor torch_xmlir wheel and run the "
            "container with " + docker_device_flags(list(range(8)), True),
            details,
        )
    if dev.count == 0:
        return Finding(
            "devices",
            "fail",
            f"{len(nodes.indices)} {ctx.dev_root}/xpuN node(s) present but the driver "
            f"reports 0 devices ({dev.source})",
            "install the vendor torch_xmlir wheel that matches the driver "
            "(torch.xpu.device_count() = 0 is expected and not the count)",
            details,
        )
    expected = range(max(dev.count, max(nodes.indices, default=-1) + 1))
    missing = [i for i in expected if i not in nodes.indices]
    if missing or not nodes.has_ctrl:
        what = [f"{ctx.dev_root}/xpu{i}" for i in missing]
        if not nodes.has_ctrl:
            what.append(f"{ctx.dev_root}/xpuctrl")
        kind = "partial device mapping" if nodes.indices else "no device nodes mapped"
        return Finding(
            "devices",
            "fail",
            f"{kind}: driver reports {dev.count} device(s), missing " + ", ".join(what),
            "run the container with every node mapped: add "
            + docker_device_flags(missing, not nodes.has_ctrl),
            details,
        )
    return Finding(
        "devices",
        "ok",
        f"{dev.count} Kunlun device(s) ({dev.source}), {ctx.dev_root}/xpu0.."
        f"{dev.count - 1} and {ctx.dev_root}/xpuctrl mapped; torch.xpu's count is a "
        "stub, not the count",
        details=details,
    )
