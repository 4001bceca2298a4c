"""envs.py: defaults, parsing, bad values, and that it is the only reader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_kunlun import envs

PACKAGE = Path(envs.__file__).parent


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in envs.registry():
        monkeypatch.delenv(name, raising=False)


def test_defaults() -> None:
    assert envs.VLLM_KUNLUN_FORCE_PLATFORM is False
    assert envs.VLLM_KUNLUN_HOST_EMULATION is False
    assert envs.VLLM_KUNLUN_EMULATION_VENDOR is False
    assert envs.VLLM_KUNLUN_BUILD_EXT is True
    assert envs.VLLM_KUNLUN_SCHEMA_FIX is True
    assert envs.VLLM_KUNLUN_SAMPLER == "auto"
    assert envs.VLLM_KUNLUN_TP_SAMPLE_BROADCAST is True
    assert envs.VLLM_KUNLUN_EMULATION_KV_CACHE_GIB == 1.0


def test_every_default_parses_from_the_default_type() -> None:
    for var in envs.registry().values():
        assert var.doc and var.accepted, var.name


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1", True),
        ("TRUE", True),
        (" yes ", True),
        ("on", True),
        ("0", False),
        ("false", False),
        ("No", False),
        ("off", False),
    ],
)
def test_booleans(monkeypatch: pytest.MonkeyPatch, raw: str, expected: bool) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_FORCE_PLATFORM", raw)
    assert envs.VLLM_KUNLUN_FORCE_PLATFORM is expected


def test_values_are_read_at_access_not_import(monkeypatch: pytest.MonkeyPatch) -> None:
    assert envs.VLLM_KUNLUN_SAMPLER == "auto"
    monkeypatch.setenv("VLLM_KUNLUN_SAMPLER", "Portable")
    assert envs.VLLM_KUNLUN_SAMPLER == "portable"


def test_tp_broadcast_is_on_or_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """1 and 0 only: an "auto" that behaved exactly as 1 is gone."""
    monkeypatch.setenv("VLLM_KUNLUN_TP_SAMPLE_BROADCAST", "0")
    assert envs.VLLM_KUNLUN_TP_SAMPLE_BROADCAST is False
    monkeypatch.setenv("VLLM_KUNLUN_TP_SAMPLE_BROADCAST", "auto")
    with pytest.raises(ValueError, match="is not a boolean"):
        _ = envs.VLLM_KUNLUN_TP_SAMPLE_BROADCAST


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("VLLM_KUNLUN_FORCE_PLATFORM", "2", "is not a boolean"),
        ("VLLM_KUNLUN_SAMPLER", "gpu", "use one of: auto, vendor, native, portable"),
        ("VLLM_KUNLUN_EMULATION_KV_CACHE_GIB", "-1", "must be a positive number"),
        ("VLLM_KUNLUN_EMULATION_KV_CACHE_GIB", "lots", "must be a positive number"),
        ("VLLM_KUNLUN_TP_SAMPLE_BROADCAST", "sometimes", "is not a boolean"),
    ],
)
def test_bad_values_name_the_variable_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, name: str, raw: str, message: str
) -> None:
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        getattr(envs, name)
    assert name in str(err.value) and repr(raw) in str(err.value)


def test_unknown_attribute() -> None:
    with pytest.raises(AttributeError):
        envs.VLLM_KUNLUN_NOT_A_VARIABLE  # noqa: B018


def test_envs_is_the_only_reader_of_the_environment() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "envs.py":
            continue
        text = path.read_text()
        if re.search(r"os\.getenv|os\.environ\.get\(\s*['\"]VLLM_KUNLUN", text):
            offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []


def test_every_variable_mentioned_in_the_package_is_declared() -> None:
    mentioned = set()
    for path in PACKAGE.rglob("*.py"):
        mentioned |= set(re.findall(r"VLLM_KUNLUN_[A-Z0-9_]+", path.read_text()))
    assert mentioned - set(envs.registry()) == set()
