"""Errors of the patch engine: each names the file, the reason and the fix."""

from __future__ import annotations

from pathlib import Path


class PatchError(RuntimeError):
    """Base class: ``str(err)`` is ``"<file>: <reason>. Fix: <fix>"``."""

    def __init__(self, file: str | Path, reason: str, fix: str) -> None:
        self.file = str(file)
        self.reason = reason
        self.fix = fix
        super().__init__(f"{self.file}: {reason}. Fix: {fix}")

    def to_json(self) -> dict[str, str]:
        return {
            "type": type(self).__name__,
            "file": self.file,
            "reason": self.reason,
            "fix": self.fix,
        }


class PatchSetError(PatchError):
    """The patch set itself is malformed or inconsistent with its manifest."""


class PairMismatch(PatchError):
    """The installed vLLM / torch pair is not the one the set is for."""


class PatchRefused(PatchError):
    """A check before writing failed (drift, unwritable file); nothing was changed."""


class PatchFailed(PatchError):
    """A write failed; the files already written were restored."""


class RollbackFailed(PatchError):
    """A write failed and restoring the files already written failed too."""


class LockBusy(PatchError):
    """Another patch run holds the lock for this vLLM tree."""
