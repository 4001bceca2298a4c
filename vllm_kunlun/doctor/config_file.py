"""Reading a model's ``config.json`` for the doctor: bounded, regular files only, once.

Why: the doctor runs on whatever directory it is pointed at. A multi-GiB file named
config.json must not be read whole (twice: ``model_path`` and ``kv_budget`` both need
it), and a FIFO in its place must not hang the doctor. So: the file is opened without
blocking, must be a regular file, is read to at most ``MAX_CONFIG_BYTES`` + 1 bytes,
and a parsed config is kept for the rest of the run (keyed by the file's identity, so
a changed file is read again). Every refusal names the file and why.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

MAX_CONFIG_BYTES = 16 << 20
"""A real config.json is a few KiB (with a vision tower, tens); 16 MiB is generous."""

_CACHE: dict[tuple[str, int, int, int, int], dict[str, Any]] = {}
_CACHE_SIZE = 8


class ConfigFileError(ValueError):
    """The file cannot serve as a config.json; the message names it and why."""


def read_json_object(path: str, limit: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """The JSON object in ``path``; FileNotFoundError when it does not exist."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise ConfigFileError(
                f"{path} is {kind} (a FIFO, socket or device would hang or never "
                "end); the doctor reads regular files only"
            )
        key = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key in _CACHE:
            return _CACHE[key]
        cap = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"
        too_big = ConfigFileError(
            f"{path} is larger than {cap} ({st.st_size} bytes by its size): not a "
            "model config; the doctor does not read it"
        )
        if st.st_size > limit:
            raise too_big
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise too_big  # it grew while being read
    finally:
        os.close(fd)
    try:
        value = json.loads(b"".join(chunks).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigFileError(
            f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason})"
        ) from None
    except RecursionError:
        raise ConfigFileError(f"{path}: JSON nested too deeply") from None
    except ValueError as exc:
        raise ConfigFileError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ConfigFileError(
            f"{path} holds a JSON {type(value).__name__}, not an object"
        )
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = value
    return value
