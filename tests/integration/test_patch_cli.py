"""``vllm-kunlun patch ...`` end to end in subprocesses, on a copy of vLLM 0.15.1."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, child_env
from tests.integration.vllm_tree import (
    PATCH_SET,
    copy_tree,
    installed_root,
    sha,
    snapshot,
)
from vllm_kunlun.file_patches import engine


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if engine.read_vllm_version(installed_root()) != "0.15.1":
        pytest.skip("needs the installed vLLM 0.15.1")
    if (engine.installed_torch_version() or "").split("+")[0] != "2.5.1":
        pytest.skip("the set is for torch 2.5.1")
    return copy_tree(tmp_path / "site")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vllm_kunlun.cli", "patch", *args],
        env=child_env(fakes=False),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_status_apply_status_json(tree: Path) -> None:
    before = cli("status", "--json", "--root", str(tree))
    assert before.returncode == 0, before.stderr
    data = json.loads(before.stdout)
    assert (data["applied"], data["total"]) == (0, 7)
    assert data["root"] == str(tree) and data["vllm_version"] == "0.15.1"
    assert {p["state"] for p in data["patches"]} == {"not applied"}

    dry = cli("apply", "--dry-run", "--root", str(tree))
    assert dry.returncode == 0 and "would apply 7 file(s)" in dry.stdout
    assert all(
        f["state"] == "pristine"
        for f in json.loads(cli("status", "--json", "--root", str(tree)).stdout)[
            "files"
        ]
    )

    applied = cli("apply", "--root", str(tree))
    assert applied.returncode == 0, applied.stderr
    assert "patch_torch251: 7/7 applied" in applied.stdout
    for target, digest in PATCH_SET.files.items():
        assert sha(tree / target) == digest.after

    again = cli("apply", "--json", "--root", str(tree))
    assert again.returncode == 0
    assert json.loads(again.stdout)["changed"] == []
    assert "already applied" in json.loads(again.stdout)["message"]

    after = cli("status", "--root", str(tree))
    assert after.returncode == 0
    assert after.stdout.strip().endswith("patch_torch251: 7/7 applied")
    assert cli("verify", "--root", str(tree)).returncode == 0

    reverted = cli("revert", "--root", str(tree))
    assert reverted.returncode == 0, reverted.stderr
    assert "0/7 applied" in reverted.stdout
    assert cli("verify", "--root", str(tree)).returncode == 1


def test_drift_exit_codes_and_messages(tree: Path) -> None:
    edited = tree / "vllm/distributed/parallel_state.py"
    edited.write_bytes(edited.read_bytes() + b"\n")
    original = snapshot(tree)

    status = cli("status", "--root", str(tree))
    assert status.returncode == 1
    assert "DRIFTED" in status.stdout and "1 drifted" in status.stdout

    refused = cli("apply", "--root", str(tree))
    assert refused.returncode == 2
    assert str(edited) in refused.stderr
    assert "nothing was changed" in refused.stderr and "Fix: " in refused.stderr
    assert snapshot(tree) == original

    as_json = cli("apply", "--json", "--root", str(tree))
    error = json.loads(as_json.stdout)["error"]
    assert error["type"] == "PatchRefused" and error["file"] == str(edited)


def test_wrong_vllm_version_is_refused(tree: Path) -> None:
    version_file = tree / "vllm/_version.py"
    version_file.write_text(version_file.read_text().replace("0.15.1", "0.14.0"))
    status = cli("status", "--root", str(tree))
    assert status.returncode == 2 and "REFUSED" in status.stdout
    refused = cli("apply", "--root", str(tree))
    assert refused.returncode == 2
    assert "vLLM 0.14.0" in refused.stderr and "vllm==0.15.1" in refused.stderr


def test_default_root_comes_from_the_import_system(tree: Path) -> None:
    """With the copy first on PYTHONPATH, `import vllm` would load it: so does status."""
    env = child_env({"PYTHONPATH": str(tree)}, fakes=False)
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_kunlun.cli", "patch", "status", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["root"] == str(tree)


def test_patch_files_are_plain_git_diffs(tree: Path) -> None:
    """Reviewers can apply the set with stock tools; the result is the manifest's."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    for patch in PATCH_SET.patches:
        proc = subprocess.run(
            ["git", "apply", str(patch.source)],
            cwd=tree,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
    for target, digest in PATCH_SET.files.items():
        assert sha(tree / target) == digest.after
