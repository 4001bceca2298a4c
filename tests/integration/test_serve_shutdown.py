"""Ctrl-C on a busy ``vllm serve`` (host emulation): with 24 requests in flight
(streaming and not, completions and chat, some clients that never read), SIGINT stops
the server and every process it started within VLLM_KUNLUN_SHUTDOWN_TIMEOUT (its
default, 10 s) plus slack, each client that reads gets an error naming the shutdown
(a 503, or an error event and ``[DONE]`` on a stream) well before its own 120 s timeout, each that does not finds its connection closed, and
the port can be bound again.

Without the runtime patch ``serve_shutdown_bound`` (vllm_kunlun/guards/shutdown.py)
the clients wait out their timeouts and so does the server ("Waiting for connections to
close"): this test then fails at the exit deadline, with the server's log tail.

SIGTERM reaches the same vLLM handler and the same patch; it, the second Ctrl-C and the
deadline kill are tested in tests/unit/guards/test_shutdown_signals.py (no second engine
start). Everything is bounded: clients by their timeout, the stop by the deadline below.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import child_env
from vllm_kunlun.demo.server_process import HOST, ServerProcess, start_server
from vllm_kunlun.demo.tiny_model import write_tiny_model
from vllm_kunlun.envs import registry
from vllm_kunlun.guards.shutdown import SHUTDOWN_MESSAGE

pytestmark = pytest.mark.slow

NAME = "tiny"
# The server runs with the variable unset: the documented default is what is tested.
BOUND = float(registry()["VLLM_KUNLUN_SHUTDOWN_TIMEOUT"].default)
SLACK = 20.0
"""Past the bound: the interpreter's own exit after the stop (no timer can cut it
short), on two CPU cores that other test runs share."""
CLIENT_TIMEOUT = 120.0
MAX_TOKENS = 1900  # minutes of decoding here: every request is still running at SIGINT
PROMPT = "the quick brown fox jumps over the lazy dog"
CHAT = [{"role": "user", "content": "what is the sea ?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    model = write_tiny_model(tmp_path_factory.mktemp("shutdown") / "tiny-qwen3")
    args = [
        "--served-model-name",
        NAME,
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        "64",
    ]
    env = child_env({"VLLM_KUNLUN_HOST_EMULATION": "1", "VLLM_LOGGING_LEVEL": "INFO"})
    srv = start_server(str(model), args, env, log_dir=tmp_path_factory.mktemp("log"))
    try:
        yield srv
    finally:
        srv.stop(timeout=5)  # kills whatever a failed test left


def _body(path: str, stream: bool) -> bytes:
    fields: dict[str, object] = {"prompt": PROMPT}
    if path == "/v1/chat/completions":
        fields = {"messages": CHAT}
    return json.dumps(
        {
            "model": NAME,
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "stream": stream,
            **fields,
        }
    ).encode()


class Reader(threading.Thread):
    """A client that reads its answer: status, body, when the first chunk and the end
    came."""

    def __init__(self, port: int, path: str, stream: bool) -> None:
        super().__init__(daemon=True)
        self.port, self.path, self.stream = port, path, stream
        self.status: int | None = None
        self.body = ""
        self.error = ""
        self.first_chunk: float | None = None
        self.ended: float | None = None

    def run(self) -> None:
        try:
            conn = http.client.HTTPConnection(HOST, self.port, timeout=CLIENT_TIMEOUT)
            conn.request(
                "POST",
                self.path,
                _body(self.path, self.stream),
                {"Content-Type": "application/json"},
            )
            resp = conn.getresponse()
            self.status = resp.status
            while line := resp.readline():
                self.first_chunk = self.first_chunk or time.monotonic()
                self.body += line.decode(errors="replace")
        except Exception as exc:  # a closed connection is an answer too
            self.error = repr(exc)
        self.ended = time.monotonic()

    def __repr__(self) -> str:
        kind = "stream" if self.stream else "plain"
        return f"{kind} {self.path}: {self.status} {self.error} {self.body[-300:]!r}"


def _silent(port: int, stream: bool) -> socket.socket:
    """A client that sends its request and never reads (a 4 KiB receive buffer, so a
    stream fills it): the server must not wait for it."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(CLIENT_TIMEOUT)
    s.connect((HOST, port))
    body = _body("/v1/completions", stream)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: "
        f"application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    s.sendall(head.encode() + body)
    return s


def _drained_to_eof(s: socket.socket, timeout: float = 10.0) -> bool:
    """Read what the server left; True when the connection ends (EOF or reset)."""
    s.settimeout(timeout)
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except OSError:
        return False
    finally:
        s.close()
    return True


def _in_engine(url: str) -> int:
    """Requests the engine holds (running + waiting), from /metrics."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return 0
    total = 0.0
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        for m in re.finditer(rf"^{name}{{[^}}]*}} ([0-9.e+]+)$", text, re.M):
            total += float(m.group(1))
    return int(total)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vLLM binds
        try:
            s.bind((HOST, port))
            s.listen()
        except OSError:
            return False
    return True


def test_sigint_with_24_requests_in_flight_stops_within_the_bound(
    server: ServerProcess,
) -> None:
    tree = server.remember_tree()
    assert "EngineCore" in " ".join(p.name() for p in tree)
    readers = [
        Reader(server.port, path, stream)
        for path in ("/v1/completions", "/v1/chat/completions")
        for stream in (True, False)
        for _ in range(6 if path == "/v1/completions" else 3)
    ]
    for r in readers:
        r.start()
    silent = [_silent(server.port, stream=i < 4) for i in range(6)]
    total = len(readers) + len(silent)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        streams_going = all(r.first_chunk for r in readers if r.stream)
        if streams_going and _in_engine(server.url) >= total:
            break
        time.sleep(1)
    else:
        pytest.fail(f"{total} requests never all in flight:\n{server.log_tail()}")
    assert not any(r.ended for r in readers), readers  # none finished on its own

    sent = time.monotonic()
    server.proc.send_signal(signal.SIGINT)
    try:
        server.proc.wait(timeout=BOUND + SLACK)
    except Exception:
        pytest.fail(
            f"vllm serve still running {BOUND + SLACK:g} s after SIGINT with "
            f"{total} requests in flight; log tail:\n{server.log_tail()}"
        )
    took = time.monotonic() - sent
    print(f"vllm serve exited {took:.1f} s after SIGINT, {total} requests in flight")
    _, alive = psutil.wait_procs(tree, timeout=5)
    assert not alive, f"left running: {alive}\n{server.log_tail()}"
    assert server.proc.returncode == 0, server.log_tail()

    for r in readers:
        r.join(timeout=5)
    for r in readers:
        assert r.ended is not None and r.ended - sent < BOUND, r
        assert SHUTDOWN_MESSAGE in r.body, r  # told why, in the protocol it speaks
        if r.stream:
            assert r.status == 200 and r.body.rstrip().endswith("data: [DONE]"), r
        else:  # 503: retry elsewhere or later
            assert r.status == 503, r
    assert all(_drained_to_eof(s) for s in silent)
    assert _port_free(server.port)
    log = Path(server.log_path).read_text(errors="replace")
    failed = re.search(r"API server stopping: (\d+) in-flight request\(s\) failed", log)
    assert failed and int(failed.group(1)) >= total, log[-3000:]
    answered = max(r.ended or 0.0 for r in readers) - sent
    print(f"every reading client had its error {answered:.1f} s after SIGINT")
