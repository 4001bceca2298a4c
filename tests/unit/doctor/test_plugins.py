"""Doctor check ``plugins``: VLLM_PLUGINS against the plugin's installed entry points."""

from __future__ import annotations

import pytest

from vllm_kunlun.checks.finding import Context
from vllm_kunlun.doctor.plugins import check_plugins, our_entry_points, schema_gap

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


GAP = "on torch 2.5.1 `import vllm.config` ... dies in torch's infer_schema"


def test_platform_plugin_left_out_on_torch_251_names_the_import_failure() -> None:
    """VLLM_PLUGINS=nonexistent,,kunlun_runtime_fixes: vLLM never calls register(),
    which applies the schema fix, so `from vllm import LLM` dies in infer_schema; the
    finding says so and offers the patch set as the other way out."""
    env = {"VLLM_PLUGINS": "nonexistent,,kunlun_runtime_fixes"}
    f = check_plugins(Context(), environ=env, ours=OURS, import_gap=lambda: GAP)
    assert f.status == "fail" and f.cause.endswith(f"; {GAP}")
    assert f.fix.startswith("export VLLM_PLUGINS=nonexistent,kunlun_runtime_fixes,")
    assert f.fix.endswith("run `vllm-kunlun patch apply`")
    assert f.details["import_vllm_config"] == GAP


def test_import_gap_is_only_asked_when_the_platform_plugin_is_out() -> None:
    def boom() -> str:
        raise AssertionError("asked although the platform plugin loads")

    f = check_plugins(
        Context(), environ={"VLLM_PLUGINS": "kunlun"}, ours=OURS, import_gap=boom
    )
    assert f.status == "warn" and "infer_schema" not in f.cause
    env = {"VLLM_PLUGINS": "kunlun_runtime_fixes"}
    f = check_plugins(Context(), environ=env, ours=OURS, import_gap=lambda: None)
    assert "infer_schema" not in f.cause and "patch apply" not in f.fix


@pytest.mark.parametrize(("applied", "gap"), [(0, True), (6, True), (7, False)])
def test_schema_gap_follows_the_patch_set(
    monkeypatch: pytest.MonkeyPatch, applied: int, gap: bool
) -> None:
    from vllm_kunlun.file_patches import engine
    from vllm_kunlun.patching import schema

    if not schema.needed():
        pytest.skip("torch >= 2.6 infers these schemas itself")
    monkeypatch.setattr(engine, "status_summary", lambda: (applied, 7, {}))
    found = schema_gap()
    assert bool(found) is gap
    if gap:
        assert f"({applied}/7)" in str(found) and "list[int]" in str(found)
        assert "register()" in str(found)
