"""Doctor check 2 (stack versions) and the engine's stack guard."""

from __future__ import annotations

import logging

import pytest

from vllm_kunlun.checks.finding import Context
from vllm_kunlun.checks.stack import check_stack_versions
from vllm_kunlun.guards.engine_checks import StackError, stack_guard

GOOD = {
    "vllm": "0.15.1",
    "torch": "2.5.1+cu124",
    "transformers": "5.2.0",
    "torchvision": "0.20.1+cu124",
    "kunlun_ops": "0.1.58",
    "xspeedgate_ops": "0.0.0+torch25",
    "cocopod": "1.0",
    "triton": "3.1.0",
    "vllm-kunlun": "0.1.0",
}


def _installed(**overrides: str | None):
    table = {**GOOD, **overrides}
    return lambda name: table.get(name)


def test_validated_stack_is_ok() -> None:
    f = check_stack_versions(Context(), _installed(), on_kunlun=True)
    assert f.status == "ok", f
    assert f.details["torch"]["status"] == "ok"  # local build tag ignored


def test_transformers_553_fails_with_the_install_command() -> None:
    f = check_stack_versions(
        Context(), _installed(transformers="5.5.3"), on_kunlun=False
    )
    assert f.status == "fail"
    assert "transformers 5.5.3 (validated 5.2.0): known broken" in f.cause
    assert "max_pixels" in f.cause
    assert f.fix == "pip install --no-deps --force-reinstall transformers==5.2.0"
    assert f.details["transformers"]["known_broken"] is True


def test_missing_torchvision_fails_with_the_install_command() -> None:
    """Images and video need it (vLLM 0.15.1's Qwen-VL processors import it)."""
    f = check_stack_versions(Context(), _installed(torchvision=None), on_kunlun=False)
    assert f.status == "fail"
    assert "torchvision not installed (validated 0.20.1)" in f.cause
    assert "pip install --no-deps torchvision==0.20.1" in f.fix


def test_missing_vendor_wheel_matters_only_on_kunlun() -> None:
    installed = _installed(kunlun_ops=None)
    off = check_stack_versions(Context(), installed, on_kunlun=False)
    assert off.status == "ok" and "kunlun_ops" in off.cause
    on = check_stack_versions(Context(), installed, on_kunlun=True)
    assert on.status == "fail"
    assert "kunlun_ops not installed" in on.cause
    assert "kunlun_ops 0.1.58" in on.fix


def test_guard_refuses_known_broken_transformers() -> None:
    with pytest.raises(
        StackError, match=r"transformers 5\.5\.3 is known to break"
    ) as e:
        stack_guard(_installed(transformers="5.5.3"))
    assert "transformers==5.2.0" in str(e.value)


def test_guard_only_warns_on_other_mismatches(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING, logger="vllm")
    monkeypatch.setattr(logging.getLogger("vllm"), "propagate", True)
    stack_guard(_installed(torch="2.6.0"))  # no exception
    assert any(
        "torch 2.6.0 is not the validated 2.5.1" in r.getMessage()
        for r in caplog.records
    )
