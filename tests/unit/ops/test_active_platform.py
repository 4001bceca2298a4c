"""The seams' view of the platform (ops/active_platform.py): which vLLM platforms count
as ours, and the vendor-kernel policy the seams get from them, on vLLM's real
``current_platform`` slot and the plugin's real platform classes."""

from __future__ import annotations

import pytest
import vllm.platforms
from vllm.platforms.cpu import CpuPlatform

from vllm_kunlun.ops import active_platform, chooser, routes
from vllm_kunlun.ops.int8.int8_kernel import KunlunInt8ScaledMMLinearKernel
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform
from vllm_kunlun.platforms.kunlun import KunlunPlatform


def _serve(monkeypatch: pytest.MonkeyPatch, platform: object) -> None:
    monkeypatch.setattr(vllm.platforms, "_current_platform", platform)


@pytest.mark.parametrize("ours", [KunlunPlatform, KunlunHostEmulationPlatform])
def test_the_plugins_platforms_are_recognised(
    monkeypatch: pytest.MonkeyPatch, ours: type
) -> None:
    _serve(monkeypatch, ours)
    assert active_platform.active_plugin_platform() is ours
    assert KunlunInt8ScaledMMLinearKernel.is_supported() == (True, None)


def test_vllms_own_platform_is_not_ours_and_takes_no_vendor_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _serve(monkeypatch, CpuPlatform())
    assert active_platform.active_plugin_platform() is None
    wanted, why = chooser.vendor_policy()
    assert not wanted and "not a vllm-kunlun platform" in why
    supported, reason = KunlunInt8ScaledMMLinearKernel.is_supported()
    assert not supported and reason and "vllm-kunlun platform" in reason


def test_the_policy_is_the_platforms(monkeypatch: pytest.MonkeyPatch) -> None:
    _serve(monkeypatch, KunlunPlatform)
    assert chooser.vendor_policy() == (True, "KunlunPlatform")
    _serve(monkeypatch, KunlunHostEmulationPlatform)
    monkeypatch.delenv("VLLM_KUNLUN_EMULATION_VENDOR", raising=False)
    wanted, why = chooser.vendor_policy()
    assert not wanted and "VLLM_KUNLUN_EMULATION_VENDOR=1" in why  # names the switch
    monkeypatch.setenv("VLLM_KUNLUN_EMULATION_VENDOR", "1")
    assert chooser.vendor_policy() == (True, "VLLM_KUNLUN_EMULATION_VENDOR=1")


def test_a_route_follows_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Route built under host emulation without the switch never looks for vendor
    functions and says why."""
    _serve(monkeypatch, KunlunHostEmulationPlatform)
    monkeypatch.delenv("VLLM_KUNLUN_EMULATION_VENDOR", raising=False)
    try:
        route = routes.Route("probe", ["rmsnorm"])
        assert not route.ready and not route.kernels
        assert "VLLM_KUNLUN_EMULATION_VENDOR=1" in route.reason
    finally:
        routes.forget_routes()
