"""The patch engine on copies of the real vLLM 0.15.1 target files.

The engine never imports vLLM, so a copy of the target files plus ``vllm/__init__.py``
and ``vllm/_version.py`` is a complete tree for it (a few milliseconds to copy).
Expected digests come from hashlib on the bytes, never from the engine.
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.integration.vllm_tree import (
    PATCH_SET,
    SET_DIR,
    TARGETS,
    copy_tree,
    installed_root,
    sha,
    snapshot,
)
from vllm_kunlun.file_patches import engine, fsops
from vllm_kunlun.file_patches.errors import (
    LockBusy,
    PairMismatch,
    PatchFailed,
    PatchRefused,
    PatchSetError,
    RollbackFailed,
)


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if engine.read_vllm_version(installed_root()) != "0.15.1":
        pytest.skip("needs the installed vLLM 0.15.1")
    if (engine.installed_torch_version() or "").split("+")[0] != "2.5.1":
        pytest.skip("the set is for torch 2.5.1")
    return copy_tree(tmp_path / "site")


def apply(tree: Path, **kw: object):  # type: ignore[no-untyped-def]
    return engine.apply(tree, SET_DIR, **kw)  # type: ignore[arg-type]


def revert(tree: Path, **kw: object):  # type: ignore[no-untyped-def]
    return engine.revert(tree, SET_DIR, **kw)  # type: ignore[arg-type]


def test_apply_noop_revert_roundtrip(tree: Path) -> None:
    original = snapshot(tree)
    before = engine.status(tree, SET_DIR)
    assert [p.state for p in before.patches] == ["not applied"] * 7
    assert before.summary_line() == "patch_torch251: 0/7 applied"
    assert before.pair_problem is None

    out = apply(tree)
    assert sorted(out.changed) == sorted(TARGETS)
    for target in TARGETS:
        assert sha(tree / target) == PATCH_SET.files[target].after
        assert original[target] != (tree / target).read_bytes()
    after = engine.status(tree, SET_DIR)
    assert after.summary_line() == "patch_torch251: 7/7 applied"
    assert {p.state for p in after.patches} == {"applied"}

    inodes = {t: (tree / t).stat().st_ino for t in TARGETS}
    again = apply(tree)
    assert again.changed == [] and "already applied" in again.message
    assert {t: (tree / t).stat().st_ino for t in TARGETS} == inodes  # nothing written

    back = revert(tree)
    assert sorted(back.changed) == sorted(TARGETS)
    assert snapshot(tree) == original  # byte-identical, and no .bak / temp files
    assert engine.status(tree, SET_DIR).applied == 0
    assert revert(tree).changed == []


def test_permissions_are_kept(tree: Path) -> None:
    target = tree / TARGETS[0]
    os.chmod(target, 0o640)
    apply(tree)
    assert target.stat().st_mode & 0o777 == 0o640
    revert(tree)
    assert target.stat().st_mode & 0o777 == 0o640


def test_dry_run_writes_nothing(tree: Path) -> None:
    original = snapshot(tree)
    out = apply(tree, dry_run=True)
    assert sorted(out.changed) == sorted(TARGETS) and out.dry_run
    assert snapshot(tree) == original


def test_hand_edited_file_is_drifted_and_blocks_apply(tree: Path) -> None:
    edited = tree / "vllm/compilation/wrapper.py"
    edited.write_bytes(edited.read_bytes() + b"# local change\n")
    original = snapshot(tree)
    report = engine.status(tree, SET_DIR)
    states = {p.target: p.state for p in report.patches}
    assert states.pop("vllm/compilation/wrapper.py") == "drifted"
    assert set(states.values()) == {"not applied"}
    assert [f.target for f in report.drifted] == ["vllm/compilation/wrapper.py"]
    with pytest.raises(PatchRefused) as err:
        apply(tree)
    assert err.value.file == str(edited)
    assert "matches neither" in err.value.reason
    assert "force-reinstall vllm==0.15.1" in err.value.fix
    assert snapshot(tree) == original


def test_drift_after_apply_blocks_revert(tree: Path) -> None:
    apply(tree)
    edited = tree / "vllm/attention/layer.py"
    edited.write_bytes(edited.read_bytes().replace(b"num_tokens", b"n_tokens", 1))
    patched = snapshot(tree)
    detail = next(p.detail for p in engine.status(tree, SET_DIR).patches if p.detail)
    assert "vllm/attention/layer.py" in detail
    with pytest.raises(PatchRefused, match="matches neither"):
        revert(tree)
    assert snapshot(tree) == patched


def test_missing_target_is_drift(tree: Path) -> None:
    (tree / "vllm/compilation/wrapper.py").unlink()
    report = engine.status(tree, SET_DIR)
    assert "missing" in next(p.detail for p in report.patches if p.state == "drifted")
    with pytest.raises(PatchRefused, match="missing"):
        apply(tree)


def _fail_nth_replace(monkeypatch: pytest.MonkeyPatch, tree: Path, fail: set[int]):  # type: ignore[no-untyped-def]
    """Make the n-th os.replace into ``tree`` (1-based) raise; returns the call log."""
    calls: list[str] = []
    real = os.replace

    def replace(src: str, dst: str) -> None:
        if str(dst).startswith(str(tree)):
            calls.append(str(dst))
            if len(calls) in fail:
                raise OSError(28, "No space left on device", str(dst))
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    return calls


def test_failure_on_third_write_restores_every_file(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = snapshot(tree)
    calls = _fail_nth_replace(monkeypatch, tree, {3})
    with pytest.raises(PatchFailed) as err:
        apply(tree)
    assert err.value.file == str(tree / TARGETS[2])
    assert "2 file(s) already written were restored" in err.value.reason
    assert len(calls) == 5  # two writes, the failing one, two restores
    assert snapshot(tree) == original


def test_failure_after_the_rename_is_rolled_back_too(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = snapshot(tree)
    third = tree / TARGETS[2]
    real = fsops._drop_bytecode

    def drop(path: Path) -> None:
        if path == third and path.read_bytes() != original[TARGETS[2]]:
            raise OSError(5, "Input/output error", str(path))
        real(path)

    monkeypatch.setattr(fsops, "_drop_bytecode", drop)
    with pytest.raises(PatchFailed, match="3 file"):
        apply(tree)
    assert snapshot(tree) == original


def test_unusable_lock_file_is_a_clear_refusal(tree: Path) -> None:
    fsops.lock_path(tree / "vllm").mkdir()  # not a file: cannot be the lock
    with pytest.raises(LockBusy, match="refusing to use the lock file") as err:
        apply(tree)
    assert "remove" in err.value.fix


def test_failed_restore_is_reported_as_inconsistent(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fail_nth_replace(monkeypatch, tree, {3, 4})  # the first restore fails too
    with pytest.raises(RollbackFailed) as err:
        apply(tree)
    assert str(tree / TARGETS[1]) in err.value.file
    assert "inconsistent" in err.value.reason
    assert "force-reinstall" in err.value.fix


def test_read_only_target_is_refused_before_any_write(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = snapshot(tree)
    read_only = tree / TARGETS[4]
    real_access = os.access

    def access(path: os.PathLike[str] | str, mode: int) -> bool:
        if Path(path) == read_only and mode & os.W_OK:
            return False
        return real_access(path, mode)

    monkeypatch.setattr(os, "access", access)
    calls = _fail_nth_replace(monkeypatch, tree, set())
    with pytest.raises(PatchRefused) as err:
        apply(tree)
    assert err.value.file == str(read_only)
    assert "not writable" in err.value.reason
    assert calls == []
    assert snapshot(tree) == original


def test_read_only_mount_found_while_writing_is_rolled_back(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write refused by the file system after the pre-check (root ignores mode bits)."""
    original = snapshot(tree)
    read_only = str(tree / TARGETS[5])
    real = os.replace

    def replace(src: str, dst: str) -> None:
        if str(dst) == read_only:
            raise PermissionError(30, "Read-only file system", dst)
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(PatchFailed, match="Read-only file system") as err:
        apply(tree)
    assert err.value.file == read_only
    assert snapshot(tree) == original


def test_wrong_vllm_version_is_refused(tree: Path) -> None:
    version_file = tree / "vllm/_version.py"
    version_file.write_text(version_file.read_text().replace("0.15.1", "0.16.0"))
    original = snapshot(tree)
    report = engine.status(tree, SET_DIR)
    assert report.pair_problem is not None
    with pytest.raises(PairMismatch) as err:
        apply(tree)
    assert "vLLM 0.16.0" in err.value.reason and "vLLM 0.15.1" in err.value.reason
    assert "pip install --no-deps vllm==0.15.1" in err.value.fix
    with pytest.raises(PairMismatch):
        revert(tree)
    assert snapshot(tree) == original


def test_wrong_torch_refuses_apply_but_allows_revert(tree: Path) -> None:
    with pytest.raises(PairMismatch) as err:
        apply(tree, torch_version="2.6.0")
    assert "torch 2.6.0" in err.value.reason and "torch 2.5.1" in err.value.reason
    assert engine.status(tree, SET_DIR).applied == 0
    apply(tree)
    assert revert(tree, torch_version="2.6.0").changed  # the way back after upgrading


def test_corrupt_patch_set_is_refused(tree: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad-set"
    shutil.copytree(SET_DIR, bad)
    patch = bad / "07-structured-output-bitmask.patch"
    patch.write_text(
        patch.read_text().replace('float("-inf"))\n', 'float("inf"))\n', 1)
    )
    original = snapshot(tree)
    with pytest.raises(PatchSetError, match="manifest says"):
        engine.apply(tree, bad)
    assert snapshot(tree) == original


def test_verify(tree: Path) -> None:
    _, problems = engine.verify(tree, SET_DIR)
    assert len(problems) == 7 and all("not applied" in p for p in problems)
    apply(tree)
    report, problems = engine.verify(tree, SET_DIR)
    assert problems == [] and report.applied == 7


def test_lock_busy_names_the_holder(tree: Path) -> None:
    with (
        fsops.tree_lock(tree / "vllm", exclusive=True),
        pytest.raises(LockBusy, match=f"pid {os.getpid()}"),
    ):
        apply(tree, lock_timeout=0)
    assert engine.status(tree, SET_DIR).applied == 0


def test_concurrent_applies_do_not_interleave(tree: Path) -> None:
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(lambda _: apply(tree), range(4)))
    assert sorted(len(o.changed) for o in outcomes) == [0, 0, 0, 7]
    for target in TARGETS:
        assert sha(tree / target) == PATCH_SET.files[target].after


def test_status_summary_for_the_doctor(tree: Path) -> None:
    applied, total, states = engine.status_summary(tree)
    assert (applied, total) == (0, 7) and set(states.values()) == {"not applied"}
    apply(tree)
    applied, total, states = engine.status_summary(tree)
    assert (applied, total) == (7, 7)
    assert list(states) == [p.id for p in PATCH_SET.patches]


def test_engine_start_warning_once(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    messages: list[str] = []

    def log(msg: str, *args: object) -> None:
        messages.append(msg % args)

    monkeypatch.setattr(engine, "_warned", False)
    engine.warn_if_not_applied(log, root=tree)
    engine.warn_if_not_applied(log, root=tree)
    assert len(messages) == 1
    assert "patch_torch251: 0/7 applied" in messages[0]
    assert "vllm-kunlun patch apply" in messages[0]
    apply(tree)
    monkeypatch.setattr(engine, "_warned", False)
    engine.warn_if_not_applied(log, root=tree)
    assert len(messages) == 1


def test_root_may_name_the_package_and_must_hold_vllm(tree: Path) -> None:
    assert engine.locate_vllm(tree / "vllm") == tree
    with pytest.raises(PatchRefused, match="no vllm package"):
        engine.locate_vllm(tree / "vllm" / "compilation")
