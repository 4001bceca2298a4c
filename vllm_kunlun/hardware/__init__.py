"""What this process runs on, and the one function that chooses its platform.

``register()`` (vLLM's platform entry point) and ``vllm-kunlun demo`` both ask
``select_platform``; they differ only in what happens without a device: vLLM keeps its
own platform, while the demo falls back to host emulation and says so.
Importing this package stays cheap (no vLLM, no torch): vLLM calls ``register()`` in
every process; the platform classes live in ``vllm_kunlun.platforms``, named here
by class path only.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_kunlun.ops.active_platform import MARKER, active_plugin_platform

KUNLUN_PLATFORM = "vllm_kunlun.platforms.kunlun.KunlunPlatform"
EMULATION_PLATFORM = "vllm_kunlun.platforms.emulation.KunlunHostEmulationPlatform"
EMULATION_ENV = "VLLM_KUNLUN_HOST_EMULATION"


# Re-exported from ops (the seams below this layer ask vLLM for the platform themselves).
__all__ = ["MARKER", "active_plugin_platform"]


@dataclass(frozen=True)
class PlatformSelection:
    """The class vLLM should load (None: not ours), and why, in one line."""

    platform: str | None
    reason: str

    @property
    def emulation(self) -> bool:
        return self.platform == EMULATION_PLATFORM


def select_platform(emulate_without_device: bool = False) -> PlatformSelection:
    """Kunlun with a device (or when forced), host emulation when asked for; without
    either, None, or emulation when ``emulate_without_device``."""
    from vllm_kunlun import envs
    from vllm_kunlun.hardware.device import probe_devices

    if envs.VLLM_KUNLUN_HOST_EMULATION:
        return PlatformSelection(EMULATION_PLATFORM, f"{EMULATION_ENV}=1 is set")
    if envs.VLLM_KUNLUN_EMULATION_VENDOR:
        return PlatformSelection(
            EMULATION_PLATFORM,
            "VLLM_KUNLUN_EMULATION_VENDOR=1 is set (host emulation, vendor paths)",
        )
    probe = probe_devices()
    if probe.count > 0:
        return PlatformSelection(
            KUNLUN_PLATFORM, f"{probe.count} Kunlun device(s) ({probe.source})"
        )
    if envs.VLLM_KUNLUN_FORCE_PLATFORM:
        return PlatformSelection(
            KUNLUN_PLATFORM,
            f"no Kunlun device detected ({probe.source}), activated by "
            "VLLM_KUNLUN_FORCE_PLATFORM=1",
        )
    if emulate_without_device:
        return PlatformSelection(
            EMULATION_PLATFORM,
            f"no Kunlun device detected ({probe.source}); host emulation enabled for "
            f"this process and the engine processes it starts ({EMULATION_ENV}=1)",
        )
    return PlatformSelection(
        None,
        f"platform not activated: no Kunlun device detected ({probe.source}). Set "
        "VLLM_KUNLUN_FORCE_PLATFORM=1 to activate it anyway.",
    )
