"""File operations the patch engine relies on: an inter-process lock and atomic writes.

Why: a patch run that dies half-way, or two runs at once, must never leave a
half-written source file in site-packages. Every write is a temp file in the same
directory followed by ``os.replace`` (atomic on POSIX), with the mode and owner of the
file it replaces. The lock lives outside the package directory, so the package gets no
stray files.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from vllm_kunlun.patching.errors import LockBusy

TMP_SUFFIX = ".vllm-kunlun-tmp"


def lock_path(package_dir: Path) -> Path:
    """One lock file per vLLM tree, in the system temp directory."""
    key = hashlib.sha256(str(package_dir.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"vllm-kunlun-patch-{key}.lock"


@contextlib.contextmanager
def tree_lock(
    package_dir: Path, exclusive: bool, timeout: float = 60.0
) -> Iterator[Path]:
    """Hold an ``flock`` on the tree's lock file; LockBusy after ``timeout`` seconds.

    Writers take it exclusively; readers (status, verify) shared, so they never see a
    tree in the middle of an apply.
    """
    path = lock_path(package_dir)
    try:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:
            # Created by another user: flock works on a read-only descriptor too.
            fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise LockBusy(
            path,
            f"cannot open the lock file ({exc.strerror or exc})",
            "set TMPDIR to a writable directory (the lock lives in the temp "
            "directory, not next to the package)",
        ) from exc
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _read_holder(path)
                    raise LockBusy(
                        path,
                        f"another `vllm-kunlun patch` run{holder} holds the lock for "
                        f"{package_dir} (waited {timeout:g} s)",
                        "wait for it to finish, or pass a longer --lock-timeout",
                    ) from None
                time.sleep(0.05)
        if exclusive:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing releases the flock


def _read_holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
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
