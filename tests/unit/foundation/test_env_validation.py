"""Every ``VLLM_KUNLUN_*`` variable: each malformed value refused when a platform of ours
starts, with the variable, the value and what is accepted; the doctor fails on it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vllm_kunlun import envs
from vllm_kunlun.checks.finding import Context, run_checks
from vllm_kunlun.doctor.environment import check_environment
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform
from vllm_kunlun.platforms.kunlun import KunlunPlatform

# Every declared variable, with values it must refuse (a new variable adds its row).
MALFORMED: dict[str, list[str]] = {
    "VLLM_KUNLUN_FORCE_PLATFORM": ["2", "maybe", ""],
    "VLLM_KUNLUN_HOST_EMULATION": ["2", "emulate"],
    "VLLM_KUNLUN_EMULATION_VENDOR": ["2", "fakes"],
    "VLLM_KUNLUN_EMULATION_KV_CACHE_GIB": [
        "inf",
        "-inf",
        "nan",
        "1e400",
        "1e12",
        "0",
        "-1",
        "lots",
        "1e-320",  # finite and positive, but 0 bytes
        "0.0009",  # under the 1 MiB floor
    ],
    "VLLM_KUNLUN_BUILD_EXT": ["yes please"],
    "VLLM_KUNLUN_SCHEMA_FIX": ["-1"],
    "VLLM_KUNLUN_SAMPLER": ["fast", "cuda", ""],
    "VLLM_KUNLUN_INT8_MM": ["fast", "int8"],
    "VLLM_KUNLUN_GDN": ["fla", "cuda"],
    "VLLM_KUNLUN_TP_SAMPLE_BROADCAST": ["2", "always"],
    "VLLM_KUNLUN_PATCH_DIR": ["/no/such/patch/set"],
    "VLLM_KUNLUN_MAX_N": ["0", "-3", "1.5", "lots", "1e9", "65537"],
    "VLLM_KUNLUN_MAX_MEDIA_MIB": ["0", "-1", "inf", "nan", "1e-320", "16385", "big"],
    "VLLM_KUNLUN_MAX_SPEC_TOKENS": ["0", "-1", "1.5", "65", "1000000000", "many"],
    "VLLM_KUNLUN_SHUTDOWN_TIMEOUT": ["0", "0.5", "-1", "inf", "nan", "601", "soon"],
    "VLLM_KUNLUN_RAY_PG_TIMEOUT": ["0", "0.5", "-1", "inf", "3601", "never"],
}
CASES = [(name, raw) for name, values in MALFORMED.items() for raw in values]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(envs.PREFIX):
            monkeypatch.delenv(name)


def test_the_table_covers_every_declared_variable() -> None:
    assert set(MALFORMED) == set(envs.registry())


@pytest.mark.parametrize(("name", "raw"), CASES)
@pytest.mark.parametrize("platform", [KunlunHostEmulationPlatform, KunlunPlatform])
def test_platform_start_refuses_each_malformed_value(
    monkeypatch: pytest.MonkeyPatch, platform: type, name: str, raw: str
) -> None:
    monkeypatch.setenv(name, raw)
    with pytest.raises(envs.EnvVarError) as err:
        platform()  # what vLLM does in every process when it resolves the platform
    message = str(err.value)
    assert f"{name}={raw!r}" in message  # the variable and the value
    accepted_words = {  # and what it accepts
        "VLLM_KUNLUN_SAMPLER": "auto, vendor, native, portable",
        "VLLM_KUNLUN_INT8_MM": "auto, vendor, portable",
        "VLLM_KUNLUN_GDN": "auto, vendor, triton, portable",
        "VLLM_KUNLUN_EMULATION_KV_CACHE_GIB": "positive number no larger than 1024",
        "VLLM_KUNLUN_PATCH_DIR": "existing directory",
        "VLLM_KUNLUN_MAX_N": "whole number from 1 to 65536",
        "VLLM_KUNLUN_MAX_MEDIA_MIB": "positive number no larger than 16384",
        "VLLM_KUNLUN_MAX_SPEC_TOKENS": "whole number from 1 to 64",
        "VLLM_KUNLUN_SHUTDOWN_TIMEOUT": "positive number no larger than 600",
        "VLLM_KUNLUN_RAY_PG_TIMEOUT": "positive number no larger than 3600",
    }.get(name, "1/0, true/false")
    assert accepted_words in message


def test_every_malformed_variable_is_named_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_SAMPLER", "fast")
    monkeypatch.setenv("VLLM_KUNLUN_TP_SAMPLE_BROADCAST", "2")
    with pytest.raises(envs.EnvVarError) as err:
        envs.validate_all()
    assert "2 malformed" in str(err.value)
    assert "VLLM_KUNLUN_SAMPLER='fast'" in str(err.value)
    assert "VLLM_KUNLUN_TP_SAMPLE_BROADCAST='2'" in str(err.value)


@pytest.mark.parametrize("raw", ["1e-320", "1e-300", "0.0009765624"])
def test_kv_cache_gib_below_one_mib_is_refused_with_the_floor_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    # 1e-320 used to pass and became 0 bytes: the engine then died naming
    # gpu_memory_utilization, not this variable.
    monkeypatch.setenv("VLLM_KUNLUN_EMULATION_KV_CACHE_GIB", raw)
    with pytest.raises(envs.EnvVarError) as err:
        envs.validate_all()
    message = str(err.value)
    assert f"VLLM_KUNLUN_EMULATION_KV_CACHE_GIB={raw!r}" in message
    assert "at least 0.0009765625 (1 MiB)" in message
    assert "unset VLLM_KUNLUN_EMULATION_KV_CACHE_GIB for its default" in message


@pytest.mark.parametrize("raw", ["0.0009765625", "0.25", "1", "1024", " 8 "])
def test_kv_cache_gib_accepts_finite_sizes(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_EMULATION_KV_CACHE_GIB", raw)
    envs.validate_all()
    assert float(raw) == envs.VLLM_KUNLUN_EMULATION_KV_CACHE_GIB
    kv_bytes = int(envs.VLLM_KUNLUN_EMULATION_KV_CACHE_GIB * (1 << 30))  # no overflow
    assert kv_bytes >= 1 << 20  # the floor, after the conversion the platform does


def test_patch_dir_accepts_an_existing_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_PATCH_DIR", str(tmp_path))
    envs.validate_all()
    assert str(tmp_path) == envs.VLLM_KUNLUN_PATCH_DIR


def test_unknown_names_get_the_nearest_declared_one() -> None:
    environ = {"VLLM_KUNLUN_SAMPLR": "portable", "VLLM_KUNLUN_ZZZ": "1", "OTHER": "x"}
    assert envs.unknown(environ) == {
        "VLLM_KUNLUN_SAMPLR": "VLLM_KUNLUN_SAMPLER",
        "VLLM_KUNLUN_ZZZ": None,
    }
    envs.validate_all(environ)  # a typo'd name is warned about, not refused


def test_doctor_fails_on_a_malformed_value() -> None:
    finding = check_environment(
        Context(),
        environ={"VLLM_KUNLUN_HOST_EMULATION": "2", "VLLM_KUNLUN_SAMPLER": "x"},
    )
    assert finding.status == "fail"
    assert "VLLM_KUNLUN_HOST_EMULATION='2' is not a boolean" in finding.cause
    assert "VLLM_KUNLUN_SAMPLER to auto, vendor, native, portable" in finding.fix
    assert set(finding.details["malformed"]) == {
        "VLLM_KUNLUN_HOST_EMULATION",
        "VLLM_KUNLUN_SAMPLER",
    }


def test_doctor_warns_on_an_unknown_name_and_is_ok_otherwise() -> None:
    warn = check_environment(Context(), environ={"VLLM_KUNLUN_SAMPLR": "portable"})
    assert warn.status == "warn" and "did you mean VLLM_KUNLUN_SAMPLER?" in warn.cause
    ok = check_environment(Context(), environ={"VLLM_KUNLUN_SAMPLER": "portable"})
    assert ok.status == "ok" and ok.details["set"] == {
        "VLLM_KUNLUN_SAMPLER": "portable"
    }


def test_a_check_that_reads_a_malformed_variable_points_at_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_SAMPLER", "fast")

    def reads_sampler(ctx: Context) -> object:
        return envs.VLLM_KUNLUN_SAMPLER

    (finding,) = run_checks([("sampler_path", reads_sampler)], Context())  # type: ignore[list-item]
    assert finding.status == "fail"
    assert "malformed variable" in finding.cause and "environment" in finding.fix
    assert "traceback" not in finding.details  # not reported as a doctor bug
