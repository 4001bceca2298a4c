"""The doctor's ``source_sync`` check: is the installed ``vllm_kunlun`` the code in this source checkout?

In the deployment the sampler fix had to be copied by hand into both the container's
site-packages and the repository, and a stale copy is invisible until behaviour differs.
Files are compared by content hash with CRLF normalised to LF (a Windows checkout with
autocrlf must not count as different). With an editable install the installed package
*is* the checkout: the check says so instead of comparing a tree with itself.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

from vllm_kunlun.checks.finding import Context, Finding

PACKAGE = "vllm_kunlun"
# Source and package data; built artefacts (*.so, caches) differ by build, not by code.
COMPARED_SUFFIXES = (".py", ".json", ".typed")
MAX_LISTED = 10


def find_checkout(start: str) -> str | None:
    """The nearest directory at or above ``start`` holding a vllm-kunlun source tree."""
    here = os.path.abspath(start)
    while True:
        setup = os.path.join(here, "setup.py")
        if os.path.isfile(setup) and os.path.isfile(
            os.path.join(here, PACKAGE, "__init__.py")
        ):
            try:
                with open(setup, encoding="utf-8") as f:
                    if 'name="vllm-kunlun"' in f.read():
                        return here
            except OSError:
                pass
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def _files(root: str) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if name.endswith(COMPARED_SUFFIXES):
                yield os.path.relpath(os.path.join(dirpath, name), root)


def content_hash(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read().replace(b"\r\n", b"\n")).hexdigest()


def compare_trees(installed: str, source: str) -> dict[str, list[str]]:
    a, b = set(_files(installed)), set(_files(source))
    differ = sorted(
        rel
        for rel in a & b
        if content_hash(os.path.join(installed, rel))
        != content_hash(os.path.join(source, rel))
    )
    return {
        "differ": differ,
        "only_in_source": sorted(b - a),
        "only_installed": sorted(a - b),
    }


def _listed(names: list[str]) -> str:
    more = len(names) - MAX_LISTED
    return ", ".join(names[:MAX_LISTED]) + (f" (+{more} more)" if more > 0 else "")


def check_source_sync(ctx: Context, installed_dir: str | None = None) -> Finding:
    """``installed_dir``: the imported package's directory (default: this package)."""
    checkout = ctx.source_root or find_checkout(ctx.cwd)
    if checkout is None:
        return Finding(
            "source_sync",
            "skip",
            f"not run from a vllm-kunlun source checkout ({ctx.cwd})",
        )
    if installed_dir is None:
        import vllm_kunlun

        installed_dir = os.path.dirname(os.path.abspath(vllm_kunlun.__file__))
    source_pkg = os.path.join(checkout, PACKAGE)
    details: dict[str, Any] = {"installed": installed_dir, "source": source_pkg}
    if os.path.realpath(installed_dir) == os.path.realpath(source_pkg):
        return Finding(
            "source_sync",
            "ok",
            f"editable install: the installed package is this checkout ({source_pkg}), "
            "nothing to sync",
            details=details,
        )
    diff = compare_trees(installed_dir, source_pkg)
    details.update(diff)
    if not any(diff.values()):
        return Finding(
            "source_sync",
            "ok",
            f"installed {installed_dir} matches the checkout {source_pkg} "
            "(content hashes, CRLF-normalised)",
            details=details,
        )
    parts = []
    if diff["differ"]:
        parts.append(f"{len(diff['differ'])} differ: {_listed(diff['differ'])}")
    if diff["only_in_source"]:
        parts.append(
            f"{len(diff['only_in_source'])} not installed: "
            f"{_listed(diff['only_in_source'])}"
        )
    if diff["only_installed"]:
        parts.append(
            f"{len(diff['only_installed'])} only installed: "
            f"{_listed(diff['only_installed'])}"
        )
    return Finding(
        "source_sync",
        "fail",
        f"installed vllm_kunlun ({installed_dir}) is not this checkout: "
        + "; ".join(parts),
        f"reinstall from the checkout: cd {checkout} && pip install "
        "--no-build-isolation -e .",
        details,
    )
