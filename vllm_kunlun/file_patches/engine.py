"""The patch engine: status, apply, revert and verify of a file patch set.

Why: the patch_torch251 set changes files of the installed vLLM. That must be boring:
every target file is identified by its sha256 before and after the whole set, apply
changes the whole set or, on an error, nothing (checks first, atomic writes, roll back
on any failure), a second apply is a no-op, revert restores the exact pre-patch bytes by
un-applying the diffs (no ``.bak`` files next to the package), and concurrent runs are
serialised by a lock. A run killed outright (SIGKILL) cannot roll back: every file is
still whole, but the set may be partly applied and temp files may remain; status and
verify report them, and the next apply / revert removes them and completes the set.

The installed vLLM is found through the import system (never site-packages guessing);
tests pass an explicit ``root``. Nothing here imports vLLM or torch, so the engine can
repair a vLLM tree that no longer imports. Logging goes to the ``vllm.`` logger tree
(stdlib logging under the name vllm_kunlun.logger would give), so inside vLLM it follows
VLLM_LOGGING_LEVEL without importing vLLM here.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import re
import shlex
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_kunlun.file_patches import fsops
from vllm_kunlun.file_patches.errors import (
    PairMismatch,
    PatchError,
    PatchFailed,
    PatchRefused,
    PatchSetError,
    RollbackFailed,
)
from vllm_kunlun.file_patches.patchset import (
    Patch,
    PatchSet,
    apply_file_patches,
    hunks_present,
    load_patch_set,
    sha256_bytes,
)
from vllm_kunlun.versions import reinstall_vllm, release

logger = logging.getLogger(f"vllm.{__name__}")

APPLIED = "applied"
NOT_APPLIED = "not applied"
DRIFTED = "drifted"

# File states: the whole file against the manifest.
PRISTINE = "pristine"
PATCHED = "patched"
FILE_DRIFTED = "drifted"
MISSING = "missing"
UNREADABLE = "unreadable"
"""Not a readable regular file: a directory, a symlink loop, a device, no permission."""


def patch_command(
    action: str,
    root: str | os.PathLike[str] | None = None,
    patch_dir: str | os.PathLike[str] | None = None,
) -> str:
    """``vllm-kunlun patch <action>`` with the --root / --patches the user gave.

    Why: a fix hint without them would patch the default vLLM instead of the tree the
    user was looking at.
    """
    words = ["vllm-kunlun", "patch", action]
    if root is not None:
        words += ["--root", str(root)]
    if patch_dir is not None:
        words += ["--patches", str(patch_dir)]
    return shlex.join(words)


def reinstall_fix(
    vllm: str,
    root: str | os.PathLike[str] | None = None,
    patch_dir: str | os.PathLike[str] | None = None,
) -> str:
    where = (
        f" with the pip of the environment that holds {root}"
        if root is not None
        else ""
    )
    return (
        f"reinstall the pristine files{where} (`{reinstall_vllm(vllm)}`), then run "
        f"`{patch_command('apply', root, patch_dir)}`"
    )


@dataclass(frozen=True)
class FileStatus:
    target: str
    path: Path
    state: str
    sha256: str | None
    before: str
    after: str
    problem: str = ""
    """Why an UNREADABLE file could not be read."""


@dataclass(frozen=True)
class PatchStatus:
    id: str
    target: str
    state: str
    detail: str = ""


@dataclass
class Report:
    """What ``status`` knows about one vLLM tree and one patch set."""

    patch_set: PatchSet
    root: Path
    vllm_version: str | None
    torch_version: str | None
    pair_problem: PairMismatch | None
    files: list[FileStatus]
    patches: list[PatchStatus]
    leftovers: list[Path] = field(default_factory=list)
    """Temp files of an interrupted apply / revert (the next apply / revert removes
    them)."""

    @property
    def applied(self) -> int:
        return sum(p.state == APPLIED for p in self.patches)

    @property
    def total(self) -> int:
        return len(self.patches)

    @property
    def drifted(self) -> list[FileStatus]:
        return [f for f in self.files if f.state in (FILE_DRIFTED, MISSING, UNREADABLE)]

    def summary_line(self) -> str:
        line = f"{self.patch_set.name}: {self.applied}/{self.total} applied"
        drifted = sum(p.state == DRIFTED for p in self.patches)
        if drifted:
            line += f", {drifted} drifted"
        if self.leftovers:
            line += f", {len(self.leftovers)} leftover temp file(s)"
        return line

    def to_json(self) -> dict[str, Any]:
        ps = self.patch_set
        return {
            "set": ps.name,
            "set_dir": str(ps.directory),
            "for": {"vllm": ps.vllm_version, "torch": ps.torch_version},
            "root": str(self.root),
            "vllm_version": self.vllm_version,
            "torch_version": self.torch_version,
            "pair_problem": self.pair_problem.to_json() if self.pair_problem else None,
            "applied": self.applied,
            "total": self.total,
            "summary": self.summary_line(),
            "patches": [
                {"id": p.id, "target": p.target, "state": p.state, "detail": p.detail}
                for p in self.patches
            ],
            "files": [
                {
                    "target": f.target,
                    "state": f.state,
                    "sha256": f.sha256,
                    "before": f.before,
                    "after": f.after,
                    "problem": f.problem,
                }
                for f in self.files
            ],
            "leftovers": [str(p) for p in self.leftovers],
        }


@dataclass
class Outcome:
    """Result of apply / revert (also for a dry run or a no-op)."""

    action: str
    dry_run: bool
    changed: list[str]
    message: str
    report: Report
    skipped: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    """Leftover temp files of an interrupted run that were (or, in a dry run, would
    be) removed first."""

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "dry_run": self.dry_run,
            "changed": self.changed,
            "skipped": self.skipped,
            "removed": self.removed,
            "message": self.message,
            "status": self.report.to_json(),
        }


# --- locating the tree and the versions -------------------------------------------


def locate_vllm(root: str | Path | None = None) -> Path:
    """The directory that contains the ``vllm`` package.

    ``root`` may be that directory or the ``vllm`` package directory itself; without
    it, the import system decides (the vLLM that ``import vllm`` would load).
    """
    if root is not None:
        try:
            root = Path(root).resolve()
        except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
            raise PatchRefused(
                root,
                f"cannot resolve the path ({exc})",
                "pass --root an existing directory that contains the vllm package",
            ) from exc
        if (root / "vllm" / "__init__.py").is_file():
            return root
        if root.name == "vllm" and (root / "__init__.py").is_file():
            return root.parent
        raise PatchRefused(
            root,
            "no vllm package here (expected vllm/__init__.py)",
            "pass --root the directory that contains the vllm package, e.g. the "
            "site-packages of your environment",
        )
    spec = importlib.util.find_spec("vllm")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        package = Path(location).resolve()
        if (package / "__init__.py").is_file():
            return package.parent
    raise PatchRefused(
        "vllm",
        "vLLM is not importable in this Python environment",
        "install vLLM 0.15.1 (pip install --no-deps vllm==0.15.1) into this "
        "environment, or pass --root",
    )


_VERSION_RE = re.compile(
    r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M
)


def read_vllm_version(root: Path) -> str | None:
    """The version of the vLLM tree itself (its ``_version.py``), without importing it."""
    try:
        text = (root / "vllm" / "_version.py").read_text(encoding="utf-8")
    except OSError:
        return None
    m = _VERSION_RE.search(text)
    return m.group(1) if m else None


def installed_torch_version() -> str | None:
    """torch's version from its metadata (no import); falls back to importing it."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        import torch
    except ImportError:
        return None
    return str(torch.__version__)


def _release(version: str | None) -> str | None:
    return release(version) if version else None


def _pair_problem(
    ps: PatchSet, root: Path, vllm_version: str | None, torch_version: str | None
) -> PairMismatch | None:
    pair = f"vLLM {ps.vllm_version} + torch {ps.torch_version}"
    if _release(vllm_version) != ps.vllm_version:
        found = f"vLLM {vllm_version}" if vllm_version else "a vLLM of unknown version"
        return PairMismatch(
            root / "vllm",
            f"{found} is installed here; the patch set {ps.name} is for {pair}",
            f"install vLLM {ps.vllm_version} (pip install --no-deps "
            f"vllm=={ps.vllm_version}), or do not use {ps.name} with this vLLM",
        )
    if _release(torch_version) != ps.torch_version:
        found = f"torch {torch_version}" if torch_version else "no torch"
        return PairMismatch(
            root / "vllm",
            f"{found} is installed; the patch set {ps.name} is for {pair}",
            f"use torch {ps.torch_version} (the validated version); other torch "
            f"versions need no {ps.name} (revert it if it is applied)",
        )
    return None


# --- status ------------------------------------------------------------------------


def _file_status(
    ps: PatchSet, root: Path, target: str
) -> tuple[FileStatus, bytes | None]:
    digest = ps.files[target]
    path = root / target

    def unreadable(why: str) -> tuple[FileStatus, None]:
        return FileStatus(
            target, path, UNREADABLE, None, digest.before, digest.after, why
        ), None

    try:
        # stat first: reading a FIFO or a device would hang or never end.
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            return unreadable("is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            return unreadable("is not a regular file")
        data = path.read_bytes()
    except FileNotFoundError:
        return FileStatus(
            target, path, MISSING, None, digest.before, digest.after
        ), None
    except OSError as exc:  # a symlink loop, no permission, an I/O error
        return unreadable(f"cannot be read ({exc.strerror or exc})")
    sha = sha256_bytes(data)
    if sha == digest.before:
        state = PRISTINE
    elif sha == digest.after:
        state = PATCHED
    else:
        state = FILE_DRIFTED
    return FileStatus(target, path, state, sha, digest.before, digest.after), data


def _drift_detail(f: FileStatus, patch: Patch, data: bytes | None) -> str:
    if f.state == MISSING:
        return f"{f.target} is missing"
    if f.state == UNREADABLE:
        return f"{f.target} {f.problem}"
    text = (data or b"").decode("utf-8", errors="replace")
    if hunks_present(text, patch, patched=True):
        look = "its changes look applied"
    elif hunks_present(text, patch, patched=False):
        look = "its changes look absent"
    else:
        look = "the lines it changes were edited"
    return (
        f"{f.target} has sha256 {str(f.sha256)[:12]}, neither the pre-patch "
        f"{f.before[:12]} nor the patched {f.after[:12]}; {look}"
    )


def inspect_tree(
    root: str | Path | None = None,
    patch_dir: str | Path | None = None,
    torch_version: str | None = None,
    patch_set: PatchSet | None = None,
) -> Report:
    """Status without taking the lock (callers that write hold it)."""
    ps = patch_set or load_patch_set(Path(patch_dir) if patch_dir else None)
    tree = locate_vllm(root)
    vllm_version = read_vllm_version(tree)
    torch_version = torch_version or installed_torch_version()
    files: list[FileStatus] = []
    patches: list[PatchStatus] = []
    for target in ps.targets:
        f, data = _file_status(ps, tree, target)
        files.append(f)
        for patch in ps.patches_for(target):
            if f.state == PRISTINE:
                patches.append(PatchStatus(patch.id, target, NOT_APPLIED))
            elif f.state == PATCHED:
                patches.append(PatchStatus(patch.id, target, APPLIED))
            else:
                detail = _drift_detail(f, patch, data)
                patches.append(PatchStatus(patch.id, target, DRIFTED, detail))
    order = {p.id: i for i, p in enumerate(ps.patches)}
    patches.sort(key=lambda p: order[p.id])
    return Report(
        ps,
        tree,
        vllm_version,
        torch_version,
        _pair_problem(ps, tree, vllm_version, torch_version),
        files,
        patches,
        fsops.find_leftovers(tree, ps.targets),
    )


def status(
    root: str | Path | None = None,
    patch_dir: str | Path | None = None,
    torch_version: str | None = None,
    lock_timeout: float = 60.0,
) -> Report:
    """Per-patch state: applied, not applied, or drifted (matches neither side)."""
    ps = load_patch_set(Path(patch_dir) if patch_dir else None)
    tree = locate_vllm(root)
    with fsops.tree_lock(tree / "vllm", exclusive=False, timeout=lock_timeout):
        return inspect_tree(tree, torch_version=torch_version, patch_set=ps)


def status_summary(
    root: str | Path | None = None,
) -> tuple[int, int, dict[str, str]]:
    """For the doctor: ``(applied_count, total, {patch id: state})``.

    States are "applied", "not applied" and "drifted". Raises PairMismatch when the
    installed vLLM / torch pair is not the set's (the set does not apply there), and
    PatchSetError when the set cannot be read; both name the file, reason and fix.
    """
    report = inspect_tree(root)
    if report.pair_problem is not None:
        raise report.pair_problem
    return report.applied, report.total, {p.id: p.state for p in report.patches}


# --- apply / revert ----------------------------------------------------------------


def _refuse_drift(
    report: Report,
    action: str,
    root: str | os.PathLike[str] | None,
    patch_dir: str | os.PathLike[str] | None,
) -> None:
    drifted = report.drifted
    if not drifted:
        return
    f = drifted[0]
    others = f" (and {len(drifted) - 1} more)" if len(drifted) > 1 else ""
    if f.state == MISSING:
        what = "is missing"
    elif f.state == UNREADABLE:
        what = f.problem
    else:
        what = (
            f"matches neither the pre-patch sha256 {f.before[:12]} nor the "
            f"patched {f.after[:12]} (found {str(f.sha256)[:12]}): it was changed by "
            "hand or by another tool"
        )
    reason = f"{action} refused, nothing was changed: the file{others} {what}"
    vllm = report.patch_set.vllm_version
    if action == "apply":
        fix = reinstall_fix(vllm, root, patch_dir)
    else:
        where = (
            f" with the pip of the environment that holds {root}"
            if root is not None
            else ""
        )
        fix = (
            f"reinstall the pristine files{where} (`{reinstall_vllm(vllm)}`; that is "
            "the revert)"
        )
    raise PatchRefused(f.path, reason, fix)


def _refuse_escapes(tree: Path, ps: PatchSet, action: str) -> None:
    """Refuse before any change when a path the run would write, delete or create a
    file in is a symlink out of the tree: a planted ``vllm/sub -> /etc`` (or
    ``__pycache__ -> /home/x``) would make a root run write or delete files there."""
    for path in fsops.paths_written(tree, ps.targets):
        escape = fsops.escaping_link(tree, path)
        if escape is None:
            continue
        link, points_to = escape
        raise PatchRefused(
            link,
            f"{link} is a symlink to {points_to}, outside --root {tree}; {action} "
            "refused, nothing was changed (the patcher writes, deletes and creates "
            "files only inside the tree)",
            f"replace {link} with the real directory or file (e.g. reinstall vLLM "
            f"with `{reinstall_vllm(ps.vllm_version)}`), or pass --root the tree "
            "the link points into",
        )


@dataclass(frozen=True)
class _Write:
    target: str
    path: Path
    old: bytes
    new: bytes


def _plan(ps: PatchSet, files: list[FileStatus], forward: bool) -> list[_Write]:
    """New contents of every file still to change, checked against the manifest."""
    source_state = PRISTINE if forward else PATCHED
    plan: list[_Write] = []
    for f in files:
        if f.state != source_state:
            continue
        old = f.path.read_bytes()
        want = f.after if forward else f.before
        try:
            new_text = apply_file_patches(
                old.decode("utf-8"), ps.patches_for(f.target), reverse=not forward
            )
        except ValueError as exc:
            raise PatchSetError(
                f.path,
                f"the patch set does not apply to this file although its sha256 "
                f"matches the manifest ({exc})",
                "the patch set is corrupt: restore it from the vllm-kunlun source",
            ) from exc
        new = new_text.encode("utf-8")
        if sha256_bytes(new) != want:
            raise PatchSetError(
                f.path,
                f"{'applying' if forward else 'un-applying'} the patches gives sha256 "
                f"{sha256_bytes(new)[:12]}, the manifest says {want[:12]}",
                "the patch set and its manifest disagree: restore both from the "
                "vllm-kunlun source",
            )
        plan.append(_Write(f.target, f.path, old, new))
    return plan


def _check_writable(plan: list[_Write], action: str) -> None:
    problems = [(w, why) for w in plan if (why := fsops.check_writable(w.path))]
    if problems:
        w, why = problems[0]
        more = (
            f" ({len(problems) - 1} more file(s) likewise)" if len(problems) > 1 else ""
        )
        raise PatchRefused(
            w.path,
            f"{action} refused, nothing was changed: {why}{more}",
            "run as the user that owns the vLLM installation, or make the "
            "environment writable (e.g. not a read-only image layer or mount)",
        )


def _write_all(plan: list[_Write], action: str, reinstall: str) -> None:
    """Write every file or none: on any failure restore those already written."""
    current: _Write | None = None
    try:
        for w in plan:
            current = w
            fsops.write_atomic(w.path, w.new)
            if w.path.read_bytes() != w.new:
                raise OSError(f"{w.path} does not read back what was written")
    except BaseException as exc:
        # Every planned file that differs from its old bytes, including one whose
        # write failed after its rename.
        restored, failed = _roll_back(plan)
        if failed:
            raise RollbackFailed(
                ", ".join(str(w.path) for w in failed),
                f"{action} failed on {current.path if current else '?'} ({exc!r}) and "
                "restoring these files failed too: the vLLM tree is inconsistent",
                reinstall,
            ) from exc
        if not isinstance(exc, Exception):
            raise  # KeyboardInterrupt and friends: files are restored, re-raise
        assert current is not None
        raise PatchFailed(
            current.path,
            f"{action} failed while writing this file ({exc!r}); the "
            f"{restored} file(s) already written were restored, every file is as "
            "before",
            "fix the cause above (permissions, disk space, read-only mount) and rerun",
        ) from exc


def _roll_back(plan: list[_Write]) -> tuple[int, list[_Write]]:
    """Put back the old bytes of every planned file that changed; (restored, failed)."""
    restored, failed = 0, []
    for w in reversed(plan):
        try:
            if w.path.read_bytes() == w.old:
                continue
            fsops.write_atomic(w.path, w.old)
            restored += 1
            if sha256_bytes(w.path.read_bytes()) != sha256_bytes(w.old):
                raise OSError("content differs after restore")
        except Exception:
            logger.exception("vllm-kunlun patch: could not restore %s", w.path)
            failed.append(w)
    return restored, failed


def _change(
    forward: bool,
    root: str | Path | None,
    patch_dir: str | Path | None,
    dry_run: bool,
    torch_version: str | None,
    lock_timeout: float,
) -> Outcome:
    action = "apply" if forward else "revert"
    ps = load_patch_set(Path(patch_dir) if patch_dir else None)
    tree = locate_vllm(root)
    # Before the lock too: a vllm package linked out of the tree would put the lock
    # file out there.
    _refuse_escapes(tree, ps, action)
    with fsops.tree_lock(tree / "vllm", exclusive=True, timeout=lock_timeout):
        _refuse_escapes(tree, ps, action)  # again, right before the first change
        report = inspect_tree(tree, torch_version=torch_version, patch_set=ps)
        # Temp files of a run that was killed before its rename (the lock is ours,
        # so no other run is writing them): remove them first.
        removed = [str(p) for p in report.leftovers]
        if removed and not dry_run:
            stuck = fsops.remove_leftovers(report.leftovers)
            if stuck:
                raise PatchRefused(
                    stuck[0],
                    f"{action} refused, nothing was changed: cannot remove this "
                    "leftover temp file of an interrupted run"
                    + (f" ({len(stuck) - 1} more likewise)" if len(stuck) > 1 else ""),
                    "remove it by hand (it is not part of vLLM) and rerun",
                )
            report = inspect_tree(tree, torch_version=torch_version, patch_set=ps)
        problem = report.pair_problem
        # Reverting only needs the right vLLM: it restores vLLM's own files, which is
        # the way back after a torch upgrade.
        if problem is not None and (
            forward or _release(report.vllm_version) != ps.vllm_version
        ):
            raise problem
        _refuse_drift(report, action, root, patch_dir)
        plan = _plan(ps, report.files, forward)
        done_state = PATCHED if forward else PRISTINE
        skipped = [f.target for f in report.files if f.state == done_state]
        if not plan:
            word = "applied" if forward else "reverted (every file is pristine)"
            return Outcome(
                action,
                dry_run,
                [],
                f"{ps.name}: already {word}, nothing to do",
                report,
                skipped,
                removed,
            )
        _check_writable(plan, action)
        targets = [w.target for w in plan]
        if dry_run:
            return Outcome(
                action,
                True,
                targets,
                f"{ps.name}: dry run, would {action} {len(plan)} file(s); nothing "
                "was written",
                report,
                skipped,
                removed,
            )
        _write_all(plan, action, reinstall_fix(ps.vllm_version, root, patch_dir))
        after = inspect_tree(tree, torch_version=torch_version, patch_set=ps)
        logger.info(
            "vllm-kunlun patch: %s %s: %d file(s) written in %s",
            action,
            ps.name,
            len(plan),
            tree / "vllm",
        )
        return Outcome(
            action,
            False,
            targets,
            f"{ps.name}: {'applied' if forward else 'reverted'} {len(plan)} file(s)",
            after,
            skipped,
            removed,
        )


def apply(
    root: str | Path | None = None,
    patch_dir: str | Path | None = None,
    dry_run: bool = False,
    torch_version: str | None = None,
    lock_timeout: float = 60.0,
) -> Outcome:
    """Apply the whole set or nothing; a second apply is a no-op."""
    return _change(True, root, patch_dir, dry_run, torch_version, lock_timeout)


def revert(
    root: str | Path | None = None,
    patch_dir: str | Path | None = None,
    dry_run: bool = False,
    torch_version: str | None = None,
    lock_timeout: float = 60.0,
) -> Outcome:
    """Restore the exact pre-patch bytes (checked against the manifest's sha256)."""
    return _change(False, root, patch_dir, dry_run, torch_version, lock_timeout)


def verify(
    root: str | Path | None = None,
    patch_dir: str | Path | None = None,
    torch_version: str | None = None,
    lock_timeout: float = 60.0,
) -> tuple[Report, list[str]]:
    """Status plus a self-check: each file's other side is derivable from the diffs.

    Returns the report and a list of problems; the set is verified when every patch
    is applied and the list is empty (revert is then known to reproduce the pristine
    bytes).
    """
    ps = load_patch_set(Path(patch_dir) if patch_dir else None)
    tree = locate_vllm(root)
    problems: list[str] = []
    with fsops.tree_lock(tree / "vllm", exclusive=False, timeout=lock_timeout):
        report = inspect_tree(tree, torch_version=torch_version, patch_set=ps)
        if report.pair_problem is not None:
            problems.append(str(report.pair_problem))
        for f in report.files:
            if f.state not in (PRISTINE, PATCHED):
                continue
            try:
                _plan(ps, [f], forward=f.state == PRISTINE)
            except PatchError as exc:
                problems.append(str(exc))
    for p in report.patches:
        if p.state != APPLIED:
            problems.append(f"{p.id} ({p.target}): {p.state}. {p.detail}".strip())
    if report.leftovers:
        problems.append(
            f"{len(report.leftovers)} leftover temp file(s) of an interrupted run: "
            f"{', '.join(map(str, report.leftovers))} "
            f"(`{patch_command('apply', root, patch_dir)}` removes them)"
        )
    return report, problems


# --- engine start ------------------------------------------------------------------

_warned = False


def warn_if_not_applied(
    log: Callable[..., None] | None = None, root: str | Path | None = None
) -> None:
    """One warning per process when the set is not fully applied on torch 2.5.1.

    Cheap (hashes a handful of files); never raises: engine start must not fail here.
    """
    global _warned
    if _warned:
        return
    _warned = True
    log = log or logger.warning
    try:
        report = inspect_tree(root)
    except Exception as exc:
        log("vllm-kunlun: could not check the file patch set: %s", exc)
        return
    if report.pair_problem is not None or report.applied == report.total:
        return  # another stack: the version guard reports that
    drift = ""
    if report.drifted:
        drift = (
            f"; drifted: {', '.join(f.target for f in report.drifted)} (reinstall "
            f"vLLM {report.patch_set.vllm_version} first)"
        )
    log(
        "vllm-kunlun: %s to vLLM at %s on torch %s%s. vLLM 0.15.1 needs it on torch "
        "2.5.1 (torch.compile, structured output). Fix: %s",
        report.summary_line(),
        report.root / "vllm",
        report.torch_version,
        drift,
        patch_command("apply", root),
    )
