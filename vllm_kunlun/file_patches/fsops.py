"""File operations the patch engine relies on: an inter-process lock and atomic writes.

Why: a patch run that dies half-way, or two runs at once, must never leave a
half-written source file in site-packages. Every write is a temp file in the same
directory followed by ``os.replace`` (atomic on POSIX), with the mode and owner of the
file it replaces. A run killed before its rename (SIGKILL, power loss) can leave such
temp files behind: ``find_leftovers`` finds them for status / verify, and apply /
revert remove them under the lock.

The lock file lives beside the tree it protects (in the directory that contains the
``vllm`` package, never inside the package), so every run on that tree meets the same
lock whatever its ``TMPDIR``, and only those who may write the tree may create it. It is
opened without following links and is never truncated unless it is a regular file of
ours with a single link, so a planted link cannot make a root run overwrite another
file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import math
import os
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from vllm_kunlun.file_patches.errors import LockBusy

TMP_SUFFIX = ".vllm-kunlun-tmp"
LOCK_NAME = ".vllm-kunlun-patch.lock"

_NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def lock_path(package_dir: Path) -> Path:
    """One lock file per vLLM tree: beside the (resolved) package directory."""
    return package_dir.resolve().parent / LOCK_NAME


def check_timeout(timeout: float) -> float:
    """A lock timeout is a finite number of seconds >= 0 (NaN would wait forever)."""
    if not isinstance(timeout, (int, float)) or not math.isfinite(timeout):
        raise ValueError(f"lock timeout {timeout!r} is not a finite number of seconds")
    if timeout < 0:
        raise ValueError(f"lock timeout {timeout!r} is negative")
    return float(timeout)


def _refuse_path(path: Path, why: str) -> LockBusy:
    return LockBusy(
        path,
        f"refusing to use the lock file: {why}",
        f"remove {path} (the next run creates a fresh one); if you did not create "
        "it, someone tried to make this run write through it",
    )


def _open_lock(path: Path, exclusive: bool) -> tuple[int | None, bool]:
    """(fd, writable) of the lock file; fd None when a reader may go without it."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | _NO_FOLLOW, 0o644), True
    except OSError as exc:
        first = exc
    if first.errno == errno.ELOOP:
        raise _refuse_path(path, "it is a symbolic link") from None
    if first.errno == errno.EISDIR:
        raise _refuse_path(path, "it is a directory") from None
    if first.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        # Created by another user, or a read-only tree: flock works on a read-only
        # descriptor too.
        try:
            return os.open(path, os.O_RDONLY | _NO_FOLLOW), False
        except FileNotFoundError:
            if not exclusive:
                # Nobody can have taken it (it does not exist and we may not create
                # it): a read-only look at the tree goes ahead unlocked.
                return None, False
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refuse_path(path, "it is a symbolic link") from None
    raise LockBusy(
        path,
        f"cannot create the lock file beside the vLLM package "
        f"({first.strerror or first})",
        "run as the user that owns the vLLM installation, on a writable tree (not a "
        "read-only image layer or mount); the lock lives next to the vllm package",
    ) from first


@contextlib.contextmanager
def tree_lock(
    package_dir: Path, exclusive: bool, timeout: float = 60.0
) -> Iterator[Path]:
    """Hold an ``flock`` on the tree's lock file; LockBusy after ``timeout`` seconds.

    Writers take it exclusively; readers (status, verify) shared, so they never see a
    tree in the middle of an apply.
    """
    timeout = check_timeout(timeout)
    path = lock_path(package_dir)
    fd, writable = _open_lock(path, exclusive)
    if fd is None:
        yield path
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse_path(path, "it is not a regular file")
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _read_holder(fd)
                    raise LockBusy(
                        path,
                        f"another `vllm-kunlun patch` run{holder} holds the lock for "
                        f"{package_dir} (waited {timeout:g} s)",
                        "wait for it to finish, or pass a longer --lock-timeout",
                    ) from None
                time.sleep(0.05)
        # Only ever rewrite a lock file we own that has no other name (a hard link
        # to another file is not ours to truncate).
        if exclusive and writable and st.st_uid == os.geteuid() and st.st_nlink == 1:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing releases the flock


def _read_holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


def check_writable(path: Path) -> str | None:
    """Why ``path`` cannot be replaced atomically, or None when it can.

    Probes for real (a temp file in the directory), so a read-only mount is caught
    even for root, for whom permission bits do not count.
    """
    if not os.access(path, os.W_OK):
        return "the file is not writable (read-only file or file system)"
    directory = path.parent
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"its directory {directory} is not writable"
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".probe.", suffix=TMP_SUFFIX)
    except OSError as exc:
        return f"cannot create a file in {directory} ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(probe)
    return None


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: same directory temp file, fsync, os.replace.

    Keeps the permission bits (and owner, when allowed) of the file it replaces. On
    any error the temp file is removed and ``path`` is untouched.
    """
    st = os.stat(path)
    fd, tmp = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX
    )
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, st.st_mode & 0o7777)
        if (st.st_uid, st.st_gid) != (os.getuid(), os.getgid()):
            with contextlib.suppress(PermissionError):
                os.chown(tmp, st.st_uid, st.st_gid)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    _drop_bytecode(path)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        # Durability of the rename only; some file systems refuse it on directories.
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _drop_bytecode(path: Path) -> None:
    """Remove cached bytecode of ``path``.

    Python validates .pyc files by source mtime (in seconds) and size; an apply and a
    revert within one second that keep the size could otherwise run stale bytecode.
    """
    cache = path.parent / "__pycache__"
    for pyc in cache.glob(f"{path.stem}.*.pyc"):
        with contextlib.suppress(OSError):
            pyc.unlink()


def paths_written(root: Path, targets: Iterable[str]) -> list[Path]:
    """Every path a run on ``targets`` writes, deletes or creates files in.

    Each target file, each directory from ``root`` down to it (temp files, the write
    probe and leftover removal happen in its directory), and its directory's
    ``__pycache__`` (stale bytecode is deleted there). The lock lives in ``root``.
    """
    found: dict[Path, None] = {}
    for target in targets:
        path = root / target
        for depth in range(1, len(Path(target).parts) + 1):
            found[root.joinpath(*Path(target).parts[:depth])] = None
        found[path.parent / "__pycache__"] = None
    return list(found)


def escaping_link(root: Path, path: Path) -> tuple[Path, str] | None:
    """``(link, where it points)`` when a symlink on the way from ``root`` to ``path``
    (``path`` included) resolves outside ``root``; None when everything stays inside.

    ``root`` must be resolved. A link that cannot be resolved (a loop) is left to the
    reader, which reports the path as unreadable.
    """
    current = root
    for part in path.relative_to(root).parts:
        current = current / part
        if not current.is_symlink():
            continue
        try:
            resolved = current.resolve()
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python 3.11)
            continue
        if not resolved.is_relative_to(root):
            return current, os.readlink(current)
    return None


def find_leftovers(root: Path, targets: Iterable[str]) -> list[Path]:
    """Temp files of an interrupted run in the target files' directories.

    Only those directories: they are the only places the engine creates temp files.
    """
    found: list[Path] = []
    for directory in sorted({(root / t).parent for t in targets}):
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue  # a missing directory is reported as missing targets
        found += [
            Path(e.path)
            for e in entries
            if e.name.startswith(".") and e.name.endswith(TMP_SUFFIX)
        ]
    return sorted(found)


def remove_leftovers(paths: Iterable[Path]) -> list[Path]:
    """Unlink temp files of an interrupted run (links themselves, never their
    targets); returns those that could not be removed."""
    failed = []
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError:
            failed.append(path)
    return failed
