"""register(): cheap, re-entrant, no side effects; the answer follows the devices."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import vllm_kunlun
from vllm_kunlun.hardware import KUNLUN_PLATFORM


@pytest.fixture(autouse=True)
def _no_plugin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("VLLM_KUNLUN_"):
            monkeypatch.delenv(name)


def test_none_without_devices_and_the_same_on_every_call() -> None:
    assert vllm_kunlun.register() is None
    assert vllm_kunlun.register() is None


def test_platform_path_with_devices_on_every_call(
    fake_vendor_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_XMLIR_DEVICES", "8")
    before = set(sys.modules)
    assert vllm_kunlun.register() == KUNLUN_PLATFORM
    assert vllm_kunlun.register() == KUNLUN_PLATFORM
    # Deciding does not import the platform (that is vLLM's step, after all plugins).
    assert "vllm_kunlun.platforms.kunlun" not in set(sys.modules) - before


def test_zero_devices_is_none_unless_forced(
    fake_vendor_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_XMLIR_DEVICES", "0")
    assert vllm_kunlun.register() is None
    monkeypatch.setenv("VLLM_KUNLUN_FORCE_PLATFORM", "1")
    assert vllm_kunlun.register() == KUNLUN_PLATFORM


def test_bad_variable_raises_after_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_HOST_EMULATION", "perhaps")
    with pytest.raises(ValueError, match="VLLM_KUNLUN_HOST_EMULATION"):
        vllm_kunlun.register()


def test_schema_fix_applies_without_a_device() -> None:
    """On torch < 2.6 no vLLM command imports vllm.config without it, whichever
    platform vLLM ends up with (``vllm bench serve --help`` on a plain host)."""
    from vllm_kunlun.patching import schema

    if not schema.needed():
        pytest.skip("torch >= 2.6 needs no schema fix")
    was_applied = schema.applied()
    schema.revert()
    try:
        assert vllm_kunlun.register() is None  # no device: no platform of ours
        assert schema.applied()
    finally:
        if not was_applied:
            schema.revert()


def test_engine_command_without_any_platform_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM loads general plugins right before its engine arguments infer the device;
    with no platform at all it would say "Failed to infer device type"."""
    import vllm.platforms
    from vllm.platforms.interface import UnspecifiedPlatform

    from vllm_kunlun.hardware.device import NoDeviceError

    monkeypatch.setattr(vllm.platforms, "_current_platform", UnspecifiedPlatform())
    with pytest.raises(NoDeviceError) as err:
        vllm_kunlun.register_runtime_fixes()
    message = str(err.value)
    assert "no Kunlun device detected (torch_xmlir is not importable" in message
    assert "VLLM_KUNLUN_HOST_EMULATION=1" in message and "/dev/xpuctrl" in message
    # When register() failed on a malformed variable, that is the reason given.
    monkeypatch.setenv("VLLM_KUNLUN_HOST_EMULATION", "2")
    with pytest.raises(ValueError, match="VLLM_KUNLUN_HOST_EMULATION='2'"):
        vllm_kunlun.register_runtime_fixes()


def test_general_plugin_leaves_another_platform_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    monkeypatch.setattr(vllm.platforms, "_current_platform", CpuPlatform())
    assert vllm_kunlun.register_runtime_fixes() is None


def test_known_vllm_messages_are_explained_once_per_process(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """vLLM 0.15.1 on torch 2.5.1 logs an ERROR and a WARNING in every process that are
    harmless here; the plugin says so once, before they appear."""
    import logging

    from vllm.logger import _print_info_once

    from vllm_kunlun.patching import schema

    if not schema.needed():
        pytest.skip("the messages belong to torch < 2.6")
    _print_info_once.cache_clear()  # another test may have registered already
    caplog.set_level(logging.INFO, logger="vllm")
    for _ in range(3):
        vllm_kunlun.register()
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.getMessage() == vllm_kunlun.KNOWN_MESSAGES_LINE
    ]
    assert len(lines) == 1
    assert "Failed to import Triton kernels" in lines[0]
    assert "Failed to import from vllm._C" in lines[0]
    assert "Messages you can ignore" in lines[0]
