"""HTTP clients for the ``vllm serve`` tests (test_serve.py): a keep-alive client that
fails on a dropped connection, readers and silent clients for the shutdown test, and
the server-side facts the tests read (engine core alive, requests in the engine, the
port free again); and ``vllm-kunlun accuracy --json`` run against a server."""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
import urllib.request
from typing import Any

import psutil

from vllm_kunlun.demo.server_process import HOST, ServerProcess

NAME = "tiny"
TIMEOUT = 120.0  # seconds, per request
CLIENT_TIMEOUT = 120.0
MAX_TOKENS = 1900  # minutes of decoding here: every request is still running at SIGINT
PROMPT = "the quick brown fox jumps over the lazy dog"
SHUTDOWN_CHAT = [{"role": "user", "content": "what is the sea ?"}]
# Sampled at the server's default temperature: without ignore_eos a tiny model ends
# with its EOS within 4 tokens now and then, and "still serving" would read "stop".
NORMAL = {
    "model": NAME,
    "prompt": "the quick brown fox",
    "max_tokens": 4,
    "ignore_eos": True,
}


class Client:
    """One keep-alive HTTP connection; a dropped connection is a test failure."""

    def __init__(self, server: ServerProcess) -> None:
        self.conn = http.client.HTTPConnection(HOST, server.port, timeout=TIMEOUT)
        self.conn.connect()
        self.sock = self.conn.sock

    def post(self, path: str, body: bytes) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        self.conn.request("POST", path, body=body, headers=headers)
        resp = self.conn.getresponse()
        raw = resp.read()
        assert resp.getheader("connection", "").lower() != "close", raw
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, raw.decode(errors="replace")


def engine_core_alive(server: ServerProcess) -> bool:
    tree = server.remember_tree()
    cores = [p for p in tree if "EngineCore" in p.name()]
    return bool(cores) and all(
        p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in cores
    )


def completion(**fields: Any) -> bytes:
    return json.dumps({**NORMAL, **fields}).encode()


def assert_still_serving(server: ServerProcess, client: Client) -> None:
    """On the same connection: a normal completion; and no process was lost."""
    status, answer = client.post("/v1/completions", completion())
    assert status == 200, answer
    assert answer["choices"][0]["finish_reason"] == "length"
    assert client.conn.sock is client.sock  # keep-alive kept, not reconnected
    assert server.proc.poll() is None and engine_core_alive(server)


def assert_refused(answer: Any, param: str, *words: str) -> None:
    assert isinstance(answer, dict), answer
    error = answer["error"]
    assert error["code"] == 400 and error["param"] == param, error
    for word in words:
        assert word in error["message"], error["message"]


def request_body(path: str, stream: bool) -> bytes:
    fields: dict[str, object] = {"prompt": PROMPT}
    if path == "/v1/chat/completions":
        fields = {"messages": SHUTDOWN_CHAT}
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
                request_body(self.path, self.stream),
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


def silent_client(port: int, stream: bool) -> socket.socket:
    """A client that sends its request and never reads (a 4 KiB receive buffer, so a
    stream fills it): the server must not wait for it."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(CLIENT_TIMEOUT)
    s.connect((HOST, port))
    body = request_body("/v1/completions", stream)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: "
        f"application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    s.sendall(head.encode() + body)
    return s


def drained_to_eof(s: socket.socket, timeout: float = 10.0) -> bool:
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


def requests_in_engine(url: str) -> int:
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


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vLLM binds
        try:
            s.bind((HOST, port))
            s.listen()
        except OSError:
            return False
    return True


def accuracy_cli(
    url: str, model_dir: str, timeout: float = 600.0
) -> tuple[int, dict[str, Any], str]:
    """``vllm-kunlun accuracy --json`` as a user runs it: exit code, the JSON, stderr."""
    import subprocess
    import sys

    from tests.conftest import child_env

    cli = [sys.executable, "-m", "vllm_kunlun.cli", "accuracy"]
    proc = subprocess.run(
        [*cli, "--url", url, "--model", model_dir, "--json"],
        env=child_env(fakes=False),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, json.loads(proc.stdout), proc.stderr
