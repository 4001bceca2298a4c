"""Atomic writes and the per-tree lock of the patch engine."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from vllm_kunlun.file_patches import fsops
from vllm_kunlun.file_patches.errors import LockBusy


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if fsops.TMP_SUFFIX in p.name)


def test_write_atomic_replaces_content_and_keeps_mode(tmp_path: Path) -> None:
    target = tmp_path / "mod.py"
    target.write_bytes(b"old\n")
    os.chmod(target, 0o640)
    inode = target.stat().st_ino
    fsops.write_atomic(target, b"new\n")
    assert target.read_bytes() == b"new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert target.stat().st_ino != inode  # a new file renamed over the old one
    assert _leftovers(tmp_path) == []


def test_write_atomic_failure_leaves_the_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "mod.py"
    target.write_bytes(b"old\n")

    def refuse(src: str, dst: str) -> None:
        raise PermissionError(30, "Read-only file system", dst)

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(PermissionError):
        fsops.write_atomic(target, b"new\n")
    assert target.read_bytes() == b"old\n"
    assert _leftovers(tmp_path) == []


def test_write_atomic_drops_stale_bytecode(tmp_path: Path) -> None:
    target = tmp_path / "mod.py"
    target.write_bytes(b"x = 1\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    (cache / "mod.cpython-311.pyc").write_bytes(b"stale")
    (cache / "other.cpython-311.pyc").write_bytes(b"keep")
    fsops.write_atomic(target, b"x = 2\n")
    assert sorted(p.name for p in cache.iterdir()) == ["other.cpython-311.pyc"]


def test_check_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "mod.py"
    target.write_bytes(b"x\n")
    assert fsops.check_writable(target) is None
    real_access = os.access

    def access(path: os.PathLike[str] | str, mode: int) -> bool:
        return False if Path(path) == target else real_access(path, mode)

    monkeypatch.setattr(os, "access", access)
    assert "not writable" in str(fsops.check_writable(target))


def test_lock_is_beside_the_package_and_exclusive(tmp_path: Path) -> None:
    package = tmp_path / "vllm"
    package.mkdir()
    path = fsops.lock_path(package)
    assert path == tmp_path / fsops.LOCK_NAME  # outside the package, next to it
    with (
        fsops.tree_lock(package, exclusive=True),
        pytest.raises(LockBusy) as err,
        fsops.tree_lock(package, exclusive=False, timeout=0),
    ):
        pass
    assert f"pid {os.getpid()}" in err.value.reason
    assert "--lock-timeout" in err.value.fix
    with (
        fsops.tree_lock(package, exclusive=False),
        fsops.tree_lock(package, exclusive=False, timeout=0),
    ):
        pass  # readers share
    assert list(package.iterdir()) == []


def test_lock_differs_per_tree(tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "vllm", tmp_path / "b" / "vllm"
    assert fsops.lock_path(a) != fsops.lock_path(b)


def test_lock_follows_a_symlinked_package_to_its_tree(tmp_path: Path) -> None:
    """Two roots whose vllm is one package share one lock."""
    real = tmp_path / "real" / "vllm"
    real.mkdir(parents=True)
    (tmp_path / "other").mkdir()
    os.symlink(real, tmp_path / "other" / "vllm")
    assert fsops.lock_path(tmp_path / "other" / "vllm") == fsops.lock_path(real)


def test_leftovers_are_found_only_in_target_directories(tmp_path: Path) -> None:
    (tmp_path / "vllm" / "sub").mkdir(parents=True)
    mine = tmp_path / "vllm" / "sub" / f".b.py.x{fsops.TMP_SUFFIX}"
    mine.write_text("x")
    elsewhere = tmp_path / "vllm" / f".z.py.x{fsops.TMP_SUFFIX}"
    elsewhere.write_text("x")
    found = fsops.find_leftovers(tmp_path, ["vllm/sub/b.py"])
    assert found == [mine]
    assert fsops.remove_leftovers(found) == [] and not mine.exists()
    assert elsewhere.exists()


def test_paths_written_cover_every_directory_and_pycache(tmp_path: Path) -> None:
    got = fsops.paths_written(tmp_path, ["vllm/a/b.py", "vllm/c.py"])
    assert got == [
        tmp_path / "vllm",
        tmp_path / "vllm" / "a",
        tmp_path / "vllm" / "a" / "b.py",
        tmp_path / "vllm" / "a" / "__pycache__",
        tmp_path / "vllm" / "c.py",
        tmp_path / "vllm" / "__pycache__",
    ]


def test_escaping_link_resolves_relative_links_and_skips_loops(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "vllm").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    os.symlink("../../out", root / "vllm" / "sub")  # relative, and out of root
    os.symlink(".", root / "vllm" / "here")  # stays inside
    os.symlink("loop", root / "vllm" / "loop")
    assert fsops.escaping_link(root, root / "vllm" / "sub" / "b.py") == (
        root / "vllm" / "sub",
        "../../out",
    )
    assert fsops.escaping_link(root, root / "vllm" / "here" / "b.py") is None
    assert fsops.escaping_link(root, root / "vllm" / "here" / "sub") == (
        root / "vllm" / "here" / "sub",
        "../../out",
    )
    assert fsops.escaping_link(root, root / "vllm" / "loop") is None
    assert fsops.escaping_link(root, root / "vllm" / "missing.py") is None
