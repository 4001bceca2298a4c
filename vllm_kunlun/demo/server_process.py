"""``vllm serve`` as a child process: a free loopback port, ready when ``/health`` says
so, stopped with SIGINT (what Ctrl-C sends) and checked for leftover processes.

Why: the server tests and ``benchmarks/serve.py`` drive a real server the way a user
does, on a machine other engineers share (so the port is chosen at run time and a lost
race for it is retried), and a server that leaves its engine core or workers behind
after Ctrl-C is a bug worth catching: on an 8-card host the orphans keep the cards.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

HOST = "127.0.0.1"


class ServerError(RuntimeError):
    """The server did not come up, or did not go down cleanly."""


def free_port(host: str = HOST) -> int:
    """A port nothing listens on right now (another process may take it before the
    server binds it: ``start_server`` retries)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def serve_command(model: str, port: int, args: Sequence[str] = ()) -> list[str]:
    """``vllm serve`` through this interpreter (the ``vllm`` console script's entry)."""
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        model,
        "--host",
        HOST,
        "--port",
        str(port),
        *args,
    ]


@dataclass(frozen=True)
class Stopped:
    returncode: int | None
    seconds: float
    leftover: list[str]
    """``pid name`` of every process of the server's tree still alive after the stop
    (they were killed afterwards)."""


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    tree: dict[int, psutil.Process] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def remember_tree(self) -> list[psutil.Process]:
        """Record the server and its descendants (engine core, workers, helpers)."""
        try:
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                self.tree.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            pass
        return list(self.tree.values())

    def stop(self, timeout: float = 120.0) -> Stopped:
        """SIGINT, wait for the whole recorded tree, kill what is left."""
        self.remember_tree()
        start = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout)
        others = [p for pid, p in self.tree.items() if pid != self.proc.pid]
        remaining = max(1.0, timeout - (time.monotonic() - start))
        _, alive = psutil.wait_procs(others, timeout=remaining)
        if self.proc.poll() is None:
            alive.append(psutil.Process(self.proc.pid))
        leftover = []
        for p in alive:
            try:
                leftover.append(f"{p.pid} {p.name()}")
                p.kill()
            except psutil.NoSuchProcess:
                pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=30)
        return Stopped(self.proc.returncode, time.monotonic() - start, leftover)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def start_server(
    model: str,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    log_dir: str | os.PathLike[str] = ".",
    ready_timeout: float = 600.0,
    attempts: int = 3,
) -> ServerProcess:
    """Start ``vllm serve`` and return once ``/health`` answers 200.

    Raises ServerError with the log tail when it exits or does not become ready; a
    server that lost its port to another process is retried on a new one.
    """
    last = ""
    for _ in range(attempts):
        port = free_port()
        log_path = Path(log_dir) / f"vllm-serve-{port}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                serve_command(model, port, args),
                env=dict(os.environ if env is None else env),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        server = ServerProcess(proc, port, log_path)
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if _healthy(server.url):
                server.remember_tree()
                return server
            time.sleep(1.0)
        last = server.log_tail()
        if proc.poll() is None:
            server.stop(timeout=30)
            raise ServerError(
                f"vllm serve not ready after {ready_timeout:.0f} s on port {port}; "
                f"log tail:\n{last}"
            )
        if "address already in use" not in last.lower():
            break
    raise ServerError(f"vllm serve exited at start; log tail:\n{last}")
