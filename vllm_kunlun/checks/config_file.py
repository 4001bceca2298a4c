"""Reading a model's ``config.json`` for the checks: bounded, regular files only, once;
and its integer fields, range-checked (``config_int``), for the budget and the weights.

Why: the doctor runs on whatever directory it is pointed at. A multi-GiB file named
config.json must not be read whole (twice: ``model_path`` and ``kv_budget`` both need
it), and a FIFO in its place must not hang the doctor. So: the file is opened without
blocking, must be a regular file, is read to at most ``MAX_CONFIG_BYTES`` + 1 bytes,
and a parsed config is kept for the rest of the run (keyed by the file's identity, so
a changed file is read again). Every refusal names the file and why.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping
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


def read_config(path: str) -> dict[str, Any]:
    """``path``/config.json, size-capped, regular files only, read once per run
    (see ``config_file``); ConfigFileError names the file and why."""
    return read_json_object(os.path.join(path, "config.json"))


class ConfigRangeError(ValueError):
    """A model config value the budget cannot use (missing, not an integer, out of
    range); the message names the field."""


CONFIG_LIMITS: dict[str, int] = {
    "num_hidden_layers": 4096,
    "full_attention_interval": 4096,
    "num_attention_heads": 4096,
    "num_key_value_heads": 4096,
    "head_dim": 65536,
    "hidden_size": 1 << 20,
    "intermediate_size": 1 << 22,
    "vocab_size": 1 << 24,
    "linear_num_key_heads": 4096,
    "linear_num_value_heads": 4096,
    "linear_key_head_dim": 65536,
    "linear_value_head_dim": 65536,
    "linear_conv_kernel_dim": 1024,
}
"""Upper bounds far above any real model (the largest today have ~200 layers, hidden
sizes of tens of thousands, vocabularies of ~1M): a value above one is a broken or
hostile config, not a model."""
_DEFAULT_LIMIT = 1 << 24


def config_key(nested: str, key: str) -> str:
    return f"{nested}.{key}" if nested else key


def config_int(
    section: Mapping[str, Any],
    key: str,
    nested: str = "",
    default: Any = None,
    minimum: int = 1,
) -> int:
    """``section[key]`` as an int in [minimum, CONFIG_LIMITS[key]], or ConfigRangeError
    naming the field (``nested`` is the section's name, e.g. "text_config")."""
    name = config_key(nested, key)
    if key not in section and default is None:
        raise ConfigRangeError(f"config.json: {name} is missing")
    raw = section.get(key, default)
    if raw is None and default is not None:
        raw = default
    if isinstance(raw, float) and not math.isfinite(raw):
        raise ConfigRangeError(f"config.json: {name} = {raw!r} is not a finite integer")
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw != int(raw):
        raise ConfigRangeError(f"config.json: {name} = {raw!r:.60} is not an integer")
    limit = CONFIG_LIMITS.get(key, _DEFAULT_LIMIT)
    if not minimum <= raw <= limit:
        raise ConfigRangeError(
            f"config.json: {name} = {raw!r} is out of range ({minimum} to {limit})"
        )
    return int(raw)


def config_dtype(config: Mapping[str, Any]) -> str:
    """The checkpoint's dtype name (``bfloat16``, ``float16``, ...): its text config's
    ``dtype`` (transformers 5) or ``torch_dtype`` (older), else the top level's, else
    ``bfloat16``."""
    sub = config.get("text_config")
    text: Mapping[str, Any] = sub if isinstance(sub, Mapping) else config
    return str(
        text.get("dtype")
        or text.get("torch_dtype")
        or config.get("dtype")
        or config.get("torch_dtype")
        or "bfloat16"
    ).replace("torch.", "")
