"""register(): cheap, re-entrant, no side effects; the answer follows the devices."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import vllm_kunlun


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
    assert vllm_kunlun.register() == vllm_kunlun.KUNLUN_PLATFORM
    assert vllm_kunlun.register() == vllm_kunlun.KUNLUN_PLATFORM
    # Deciding does not import the platform (that is vLLM's step, after all plugins).
    assert "vllm_kunlun.platform" not in set(sys.modules) - before


def test_zero_devices_is_none_unless_forced(
    fake_vendor_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_XMLIR_DEVICES", "0")
    assert vllm_kunlun.register() is None
    monkeypatch.setenv("VLLM_KUNLUN_FORCE_PLATFORM", "1")
    assert vllm_kunlun.register() == vllm_kunlun.KUNLUN_PLATFORM


def test_bad_variable_raises_after_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_HOST_EMULATION", "perhaps")
    with pytest.raises(ValueError, match="VLLM_KUNLUN_HOST_EMULATION"):
        vllm_kunlun.register()
