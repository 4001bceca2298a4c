"""Who owns stdout while a ``vllm-kunlun`` command runs.

Why: vLLM logs to stdout by default (``VLLM_LOGGING_STREAM=ext://sys.stdout``), and the
engine processes it spawns inherit both the setting and the file descriptor. A ``--json``
run whose stdout carries log lines breaks every pipe into a JSON parser, and the demo's
report drowned in about 50 of them. These context managers keep stdout for what the
command itself prints. Importing this module stays cheap (no torch, no vLLM).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import IO

LOG_STREAM_ENV = "VLLM_LOGGING_STREAM"
TO_STDERR = "ext://sys.stderr"


def _fileno(stream: IO[str]) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # pytest's capsys, StringIO
        return None


def _vllm_stream_handlers() -> list[logging.StreamHandler[IO[str]]]:
    """vLLM's handlers, if vLLM configured its logging in this process already."""
    return [
        h
        for h in logging.getLogger("vllm").handlers
        if isinstance(h, logging.StreamHandler)
        and not isinstance(h, logging.FileHandler)
    ]


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@contextlib.contextmanager
def json_stdout() -> Iterator[None]:
    """Only what the command prints reaches stdout; everything else goes to stderr.

    - ``VLLM_LOGGING_STREAM=ext://sys.stderr`` for the run, read when vLLM is imported
      (here and in every engine process the command starts, which inherit it);
    - vLLM handlers already writing to stdout (vLLM imported earlier) write to stderr;
    - file descriptor 1 points at stderr, so C code and child processes that write to
      stdout land there, while ``print`` reaches the real stdout through a duplicate.
    """
    moved = [h for h in _vllm_stream_handlers() if h.stream is sys.stdout]
    for h in moved:
        h.setStream(sys.stderr)
    out_fd = _fileno(sys.stdout)
    with _env(LOG_STREAM_ENV, TO_STDERR):
        if out_fd is None:
            try:
                yield
            finally:
                for h in moved:
                    h.setStream(sys.stdout)
            return
        sys.stdout.flush()
        sys.stderr.flush()
        saved_fd = os.dup(out_fd)
        original = sys.stdout
        real = os.fdopen(os.dup(saved_fd), "w", encoding=original.encoding or "utf-8")
        os.dup2(sys.stderr.fileno(), out_fd)
        sys.stdout = real
        try:
            yield
        finally:
            real.flush()
            sys.stdout = original
            real.close()
            sys.stderr.flush()
            os.dup2(saved_fd, out_fd)
            os.close(saved_fd)
            for h in moved:
                h.setStream(original)


@contextlib.contextmanager
def output_to_file(path: str) -> Iterator[IO[str]]:
    """stdout and stderr of this process and of the processes it starts go to ``path``
    (appended) while the block runs; vLLM's handlers keep writing there afterwards (the
    engine's shutdown lines come after the block). Yields the open file."""
    log = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (kept open)
    out_fd, err_fd = _fileno(sys.stdout), _fileno(sys.stderr)
    if out_fd is None or err_fd is None:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            yield log
    else:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(out_fd), os.dup(err_fd)
        os.dup2(log.fileno(), out_fd)
        os.dup2(log.fileno(), err_fd)
        try:
            yield log
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], out_fd)
            os.dup2(saved[1], err_fd)
            os.close(saved[0])
            os.close(saved[1])
    for h in _vllm_stream_handlers():
        if h.stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            h.setStream(log)
