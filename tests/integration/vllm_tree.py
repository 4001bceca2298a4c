"""The installed vLLM tree and the repository's patch set, for the tests that copy
the tree and patch the copy (file patcher, patch imports, graph config, docs)."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
from pathlib import Path

from vllm_kunlun.file_patches import fsops
from vllm_kunlun.file_patches.patchset import load_patch_set

SET_DIR = Path(__file__).resolve().parents[2] / "patches" / "vllm-0.15.1-torch-2.5.1"
PATCH_SET = load_patch_set(SET_DIR)
TARGETS = PATCH_SET.targets


def installed_root() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent.parent


def copy_tree(dest: Path, full: bool = False) -> Path:
    """Copy the installed vLLM into ``dest`` (the targets only, or everything but .so)."""
    src = installed_root()
    if full:
        shutil.copytree(
            src / "vllm",
            dest / "vllm",
            ignore=shutil.ignore_patterns("*.so", "__pycache__"),
        )
        return dest
    for rel in ["vllm/__init__.py", "vllm/_version.py", *TARGETS]:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, dest / rel)
    return dest


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file of the tree but the lock file (which lives beside the package)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != fsops.LOCK_NAME
    }


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
