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
