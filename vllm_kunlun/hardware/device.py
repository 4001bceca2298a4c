"""How many Kunlun devices this process can use, and why we think so."""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

from vllm_kunlun.ops import vendor


@dataclass(frozen=True)
class DeviceProbe:
    count: int
    """Devices reported by the Kunlun driver (torch_xmlir); 0 when it is absent."""
    source: str
    """Where ``count`` came from, or why it is 0."""


def probe_devices() -> DeviceProbe:
    count, source = vendor.xmlir_device_count()
    return DeviceProbe(count=count, source=source)


@dataclass(frozen=True)
class DeviceNodes:
    indices: tuple[int, ...]
    """N of every ``/dev/xpuN`` node present."""
    has_ctrl: bool
    """Whether ``/dev/xpuctrl`` is present."""


def device_nodes(dev_root: str = "/dev") -> DeviceNodes:
    """The Kunlun device nodes visible in this container.

    A container needs every ``/dev/xpuN`` and ``/dev/xpuctrl``: with a partial mapping
    every distributed operation fails.
    """
    indices = []
    for path in glob.glob(os.path.join(dev_root, "xpu*")):
        m = re.fullmatch(r"xpu(\d+)", os.path.basename(path))
        if m:
            indices.append(int(m.group(1)))
    return DeviceNodes(
        indices=tuple(sorted(indices)),
        has_ctrl=os.path.exists(os.path.join(dev_root, "xpuctrl")),
    )


class NoDeviceError(RuntimeError):
    """A vLLM command that needs a device, on a host where no platform is active."""


def no_device_message(probe: DeviceProbe) -> str:
    """Why an engine command cannot start here, and the ways to make it start.

    vLLM's own words for this case are "Failed to infer device type".
    """
    return (
        "vllm-kunlun: this vLLM command needs a device and vLLM found none: no Kunlun "
        f"device detected ({probe.source}) and no other vLLM platform is active. "
        "Fix: on a Kunlun host, install the vendor torch_xmlir wheel and map every "
        "/dev/xpuN and /dev/xpuctrl into the container (`vllm-kunlun doctor` names "
        "what is missing); to run on this host's CPU instead, set "
        "VLLM_KUNLUN_HOST_EMULATION=1 (tests and demos; not a Kunlun device). "
        "Client-only commands such as `vllm bench serve` need no device."
    )
