"""Doctor check 5: patch_torch251 status, through the real patch engine on a copy of
the installed vLLM's target files in tmp_path."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vllm_kunlun.checks.finding import Context
from vllm_kunlun.doctor.patchset import check_patchset
from vllm_kunlun.file_patches import engine
from vllm_kunlun.file_patches.patchset import load_patch_set


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The set's target files (pristine), vllm/__init__.py and vllm/_version.py."""
    real = engine.locate_vllm()
    for rel in [*load_patch_set().targets, "vllm/__init__.py", "vllm/_version.py"]:
        dst = tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(real / rel, dst)
    return tmp_path


def _check(root: Path):
    return check_patchset(Context(), summary=lambda: engine.status_summary(root))


def test_pristine_tree_warns_with_the_apply_command(tree: Path) -> None:
    f = _check(tree)
    assert f.status == "warn"
    assert f.cause.startswith("patch_torch251 0/7 applied; not applied: 01-")
    assert f.fix == "vllm-kunlun patch apply"


def test_applied_tree_is_ok(tree: Path) -> None:
    engine.apply(root=tree)
    f = _check(tree)
    assert f.status == "ok", f
    assert f.cause.startswith("patch_torch251 7/7 applied")


def test_hand_edited_file_is_drifted(tree: Path) -> None:
    target = tree / load_patch_set().targets[0]
    target.write_text(target.read_text() + "\n# edited by hand\n")
    f = _check(tree)
    assert f.status == "fail"
    assert "drifted" in f.cause and "--force-reinstall vllm==0.15.1" in f.fix


def test_other_torch_is_not_this_sets_business(tree: Path) -> None:
    f = check_patchset(Context(), summary=lambda: _raise_pair(tree))
    assert f.status == "skip"
    assert "torch 2.6.0" in f.cause


def _raise_pair(tree: Path) -> tuple[int, int, dict[str, str]]:
    """status_summary's refusal for torch 2.6.0 (the set is for torch 2.5.1)."""
    report = engine.inspect_tree(tree, torch_version="2.6.0")
    assert report.pair_problem is not None
    raise report.pair_problem
