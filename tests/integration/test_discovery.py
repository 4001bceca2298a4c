"""vLLM's real plugin discovery resolves (or skips) KunlunPlatform in a fresh process."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_python

PROBE = """
import json
from vllm.platforms import current_platform
import vllm.platforms as p
cls = type(current_platform)
print("RESULT " + json.dumps({
    "cls": f"{cls.__module__}.{cls.__qualname__}",
    "device_count": current_platform.device_count()
        if cls.__module__.startswith("vllm_kunlun") else None,
}))
"""


def _resolve(env: dict[str, str], fakes: bool = True) -> tuple[dict, str]:
    proc = run_python(PROBE, env=env, fakes=fakes)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :]), proc.stdout + proc.stderr


def test_eight_fake_devices_activate_kunlun_platform() -> None:
    result, log = _resolve({"FAKE_XMLIR_DEVICES": "8"})
    assert result["cls"] == "vllm_kunlun.platforms.kunlun.KunlunPlatform"
    assert result["device_count"] == 8
    assert "Platform plugin kunlun is activated" in log
    assert "KunlunPlatform active" in log  # our own INFO line reaches vLLM's handler


@pytest.mark.parametrize(
    ("env", "fakes", "reason"),
    [
        ({"FAKE_XMLIR_DEVICES": "0"}, True, "no Kunlun device detected"),
        ({}, False, "torch_xmlir is not importable"),
    ],
    ids=["driver-reports-0", "no-torch_xmlir"],
)
def test_without_devices_vllm_keeps_its_own_platform(
    env: dict[str, str], fakes: bool, reason: str
) -> None:
    result, log = _resolve(env, fakes=fakes)
    assert not result["cls"].startswith("vllm_kunlun")
    assert "platform not activated" in log
    assert reason in log


def test_plugin_filtered_out_by_vllm_plugins() -> None:
    result, log = _resolve({"FAKE_XMLIR_DEVICES": "8", "VLLM_PLUGINS": "someone_else"})
    assert not result["cls"].startswith("vllm_kunlun")
    assert "Platform plugin kunlun is activated" not in log


def test_force_variable_activates_without_devices() -> None:
    result, _ = _resolve({"FAKE_XMLIR_DEVICES": "0", "VLLM_KUNLUN_FORCE_PLATFORM": "1"})
    assert result["cls"] == "vllm_kunlun.platforms.kunlun.KunlunPlatform"
    assert result["device_count"] == 0


def test_bad_force_value_is_logged_not_silent() -> None:
    # vLLM swallows register()'s exception; the log must still name the cause.
    result, log = _resolve(
        {"FAKE_XMLIR_DEVICES": "0", "VLLM_KUNLUN_FORCE_PLATFORM": "maybe"}
    )
    assert not result["cls"].startswith("vllm_kunlun")
    assert "register() failed" in log
    assert "VLLM_KUNLUN_FORCE_PLATFORM='maybe' is not a boolean" in log
