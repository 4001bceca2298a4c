"""Which vllm-kunlun platform serves this process, asked of vLLM, for the kernel seams.

Why here: the seams of ``ops/`` (and quantization above them) must know whether a
vllm-kunlun platform is active and what its vendor-kernel policy is, but they sit below
``hardware/`` and ``platforms/``: they ask vLLM's own ``current_platform`` for the
class attribute every vllm-kunlun platform sets, never import the platform classes.
"""

from __future__ import annotations

from typing import Any

MARKER = "is_vllm_kunlun_platform"
"""Class attribute every vllm-kunlun platform sets (platforms/kunlun.py)."""


def active_plugin_platform() -> Any | None:
    """vLLM's current platform when it is one of ours (Kunlun or host emulation)."""
    from vllm.platforms import current_platform

    return current_platform if getattr(current_platform, MARKER, False) else None
