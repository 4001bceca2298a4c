"""Doctor check ``plugins``: VLLM_PLUGINS against the plugin's installed entry points."""

from __future__ import annotations

import pytest

from vllm_kunlun.doctor.finding import Context
from vllm_kunlun.doctor.plugins import check_plugins, our_entry_points

OURS = {
    "kunlun": "vllm.platform_plugins",
    "kunlun_runtime_fixes": "vllm.general_plugins",
}


def test_installed_entry_points_are_read_from_the_metadata() -> None:
    """The names the check compares are setup.py's, as installed (not restated)."""
    assert our_entry_points() == OURS


def test_unset_loads_everything() -> None:
    f = check_plugins(Context(), environ={}, ours=OURS)
    assert f.status == "ok" and "VLLM_PLUGINS unset" in f.cause


def test_both_named_is_ok() -> None:
    env = {"VLLM_PLUGINS": "other,kunlun,kunlun_runtime_fixes"}
    assert check_plugins(Context(), environ=env, ours=OURS).status == "ok"


def test_general_plugin_left_out_warns_with_the_fix() -> None:
    """VLLM_PLUGINS=kunlun: the workers sample on the device anyway (the worker applies
    the runtime fixes), but the front end loses its engine-start guards."""
    f = check_plugins(Context(), environ={"VLLM_PLUGINS": "kunlun"}, ours=OURS)
    assert f.status == "warn"
    assert "kunlun_runtime_fixes (vllm.general_plugins)" in f.cause
    assert "without the engine-start guards" in f.cause
    assert f.fix.startswith("export VLLM_PLUGINS=kunlun,kunlun_runtime_fixes ")
    assert f.details["missing"] == ["kunlun_runtime_fixes"]


def test_platform_plugin_left_out_fails() -> None:
    env = {"VLLM_PLUGINS": "kunlun_runtime_fixes"}
    f = check_plugins(Context(), environ=env, ours=OURS)
    assert f.status == "fail" and "never picks the Kunlun platform" in f.cause
    assert "export VLLM_PLUGINS=kunlun_runtime_fixes,kunlun" in f.fix


@pytest.mark.parametrize("raw", ["", "lora_resolver"])
def test_empty_or_foreign_list_leaves_both_out(raw: str) -> None:
    f = check_plugins(Context(), environ={"VLLM_PLUGINS": raw}, ours=OURS)
    assert f.status == "fail" and f.details["missing"] == sorted(OURS)


def test_spaces_are_not_trimmed_by_vllm_and_are_pointed_out() -> None:
    env = {"VLLM_PLUGINS": "kunlun, kunlun_runtime_fixes"}
    f = check_plugins(Context(), environ=env, ours=OURS)
    assert f.status == "warn" and "does not trim spaces" in f.cause
    assert "export VLLM_PLUGINS=kunlun,kunlun_runtime_fixes " in f.fix


def test_not_installed_is_a_failure() -> None:
    f = check_plugins(Context(), environ={}, ours={})
    assert f.status == "fail" and "entry points are not installed" in f.cause


def test_registered_among_the_doctor_checks() -> None:
    from vllm_kunlun.doctor.checks import CHECKS

    names = [name for name, _ in CHECKS]
    assert names.index("plugins") < names.index("platform")
