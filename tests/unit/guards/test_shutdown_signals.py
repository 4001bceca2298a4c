"""The shutdown bound's signal paths (vllm_kunlun/guards/shutdown.py) on vLLM's real
``serve_http`` and uvicorn, in a child process that stands in for ``vllm serve``: SIGTERM
fails the in-flight requests and the process exits, a second signal ends it at once,
and an engine that never stops is killed at the deadline.

The child serves a FastAPI app whose handlers wait on per-request queues the way vLLM's
wait on a stopped engine (only an error ever arrives), with a ``sleep`` child process as
its engine core. tests/integration/test_serve.py drives the same patch through
a real ``vllm serve`` with SIGINT; SIGTERM takes the same handler (vLLM installs one
function for both), tested here without a second engine start.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
import pytest

from tests.conftest import REPO, child_env
from vllm_kunlun.guards.shutdown import SHUTDOWN_MESSAGE

pytestmark = pytest.mark.slow

SERVER = textwrap.dedent(
    """
    import asyncio, json, os, socket, subprocess, sys, time

    import uvloop
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse
    from vllm.entrypoints import launcher

    from vllm_kunlun.guards import shutdown

    class Processor:  # the part of vLLM's OutputProcessor the patch uses
        def __init__(self):
            self.request_states = {}

        def propagate_error(self, e):
            for q in self.request_states.values():
                q.put_nowait(e)

    class Engine:  # what serve_http's watchdog reads
        errored = False
        is_running = True
        output_processor = Processor()

    app = FastAPI()
    app.state.engine_client = Engine()

    async def wait_for_engine(rid):
        q = asyncio.Queue()
        Engine.output_processor.request_states[rid] = q
        try:
            raise await q.get()  # a stopped engine sends nothing but an error
        finally:
            del Engine.output_processor.request_states[rid]

    @app.get("/ready")
    async def ready():
        return {"in_flight": len(Engine.output_processor.request_states)}

    @app.post("/plain")
    async def plain(rid: str):
        try:
            await wait_for_engine(rid)
        except Exception as e:
            return JSONResponse({"error": str(e)}, status_code=500)

    @app.post("/stream")
    async def stream(rid: str):
        async def events():
            yield "data: first\\n\\n"
            try:
                await wait_for_engine(rid)
            except Exception as e:
                yield "data: " + json.dumps({"error": str(e)}) + "\\n\\n"
            yield "data: [DONE]\\n\\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("CORE", core.pid, flush=True)

    async def main():
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        print("PORT", port, flush=True)
        serve = shutdown._make_bounded(launcher.serve_http)  # as the patch installs it
        done = await serve(app, sock, host="127.0.0.1", port=port, log_level="warning")
        time.sleep(float(os.environ.get("ENGINE_STOP_SECONDS", "0")))
        core.terminate()  # the engine shutdown vLLM does next
        core.wait()
        await done
        sock.close()

    uvloop.run(main())
    print("EXITED CLEANLY", flush=True)
    """
)
CLIENT_TIMEOUT = 60.0  # far above every bound below: a client that waits it out failed
SLACK = 10.0
"""Past the bound, for the interpreter's own exit (module teardown of vLLM and torch,
which no timer can interrupt) on a host that other test runs load."""


@dataclass
class Child:
    proc: subprocess.Popen[str]
    port: int
    core: psutil.Process
    lines: list[str] = field(default_factory=list)

    def output(self) -> str:
        return "".join(self.lines)

    def wait_for_line(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return
            time.sleep(0.05)
        raise AssertionError(
            f"no {text!r} within {timeout} s:\n{self.output()[-3000:]}"
        )


def _start(env: dict[str, str]) -> Child:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        env=child_env(env),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    stdout = proc.stdout

    def pump() -> None:
        for line in stdout:
            lines.append(line)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + 240
    port = core = None
    while time.monotonic() < deadline and proc.poll() is None:
        text = "".join(lines)
        if port is None and "PORT " in text:
            port = int(text.split("PORT ")[1].split()[0])
        if core is None and "CORE " in text:
            core = psutil.Process(int(text.split("CORE ")[1].split()[0]))
        if port and core and _get(port, "/ready") is not None:
            return Child(proc, port, core, lines)
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(
        "the stand-in server did not start:\n" + "".join(lines)[-3000:]
    )


def _get(port: int, path: str) -> Any:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", path)
        return json.loads(conn.getresponse().read())
    except (OSError, ValueError):
        return None


@pytest.fixture
def started() -> Iterator[list[Child]]:
    children: list[Child] = []
    yield children
    for child in children:  # whatever a failed test left
        if child.proc.poll() is None:
            child.proc.kill()
        with contextlib.suppress(psutil.Error):
            child.core.kill()


class Client(threading.Thread):
    """One request; records what came back and when."""

    def __init__(self, port: int, path: str) -> None:
        super().__init__(daemon=True)
        self.port, self.path = port, path
        self.status: int | None = None
        self.body = ""
        self.error = ""
        self.ended: float | None = None

    def run(self) -> None:
        try:
            conn = http.client.HTTPConnection(
                "127.0.0.1", self.port, timeout=CLIENT_TIMEOUT
            )
            conn.request("POST", f"{self.path}?rid={id(self)}")
            resp = conn.getresponse()
            self.status = resp.status
            self.body = resp.read().decode()
        except Exception as exc:  # a closed connection is an answer too
            self.error = repr(exc)
        self.ended = time.monotonic()


def _in_flight(child: Child, count: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready = _get(child.port, "/ready")
        if ready and ready["in_flight"] >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"{count} requests never in flight:\n{child.output()[-3000:]}")


def _exited(child: Child, timeout: float) -> float:
    """Seconds until the child exited (fails, with its output, if it did not)."""
    start = time.monotonic()
    try:
        child.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"still running {timeout} s after the signal:\n{child.output()[-3000:]}"
        ) from None
    return time.monotonic() - start


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vLLM binds
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
    return True


def test_sigterm_fails_in_flight_requests_and_exits(started: list[Child]) -> None:
    child = _start({"VLLM_KUNLUN_SHUTDOWN_TIMEOUT": "5"})
    started.append(child)
    clients = [Client(child.port, p) for p in ("/plain", "/stream") * 3]
    for c in clients:
        c.start()
    _in_flight(child, len(clients))
    sent = time.monotonic()
    child.proc.send_signal(signal.SIGTERM)
    _exited(child, 5 + SLACK)
    for c in clients:
        c.join(timeout=CLIENT_TIMEOUT)
    assert child.proc.returncode == 0, child.output()[-3000:]
    assert "EXITED CLEANLY" in child.output()
    assert "in-flight request(s) failed" in child.output()
    for c in clients:
        assert c.ended is not None and c.ended - sent < 5, (c.path, c.error)
        assert SHUTDOWN_MESSAGE in c.body, (c.path, c.status, c.body, c.error)
        if c.path == "/plain":
            assert c.status == 500
        else:  # the stream ends with the error event, then [DONE]
            assert c.body.rstrip().endswith("data: [DONE]"), c.body
    assert not child.core.is_running()
    assert _port_free(child.port)


def test_a_second_ctrl_c_ends_it_at_once(started: list[Child]) -> None:
    """The engine takes 120 s to stop and the bound is 60 s: only the second signal
    can end it within seconds, and it takes the engine core with it. (SIGTERM gets
    the same handler; one child process per case is what this costs.)"""
    sig = signal.SIGINT
    child = _start({"VLLM_KUNLUN_SHUTDOWN_TIMEOUT": "60", "ENGINE_STOP_SECONDS": "120"})
    started.append(child)
    child.proc.send_signal(sig)
    child.wait_for_line("API server stopping", timeout=20)
    assert child.proc.poll() is None
    child.proc.send_signal(sig)
    took = _exited(child, SLACK)
    assert took < 5, child.output()[-3000:]  # no engine stop, no interpreter teardown
    assert child.proc.returncode == 128 + sig, child.output()[-3000:]
    assert f"a second {sig.name} during shutdown" in child.output()
    assert "EXITED CLEANLY" not in child.output()
    psutil.wait_procs([child.core], timeout=5)
    assert not child.core.is_running()
    assert _port_free(child.port)


def test_an_engine_that_never_stops_is_killed_at_the_deadline(
    started: list[Child],
) -> None:
    child = _start({"VLLM_KUNLUN_SHUTDOWN_TIMEOUT": "3", "ENGINE_STOP_SECONDS": "120"})
    started.append(child)
    sent = time.monotonic()
    child.proc.send_signal(signal.SIGTERM)
    _exited(child, 3 + SLACK)
    took = time.monotonic() - sent
    assert 3 <= took < 3 + 5, child.output()[-3000:]  # the timer, then os._exit
    assert child.proc.returncode == 1, child.output()[-3000:]
    assert "still running 3 s after the stop began" in child.output()
    psutil.wait_procs([child.core], timeout=5)
    assert not child.core.is_running()


def test_the_bound_is_a_validated_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_kunlun import envs
    from vllm_kunlun.guards.shutdown import drain_seconds

    monkeypatch.delenv("VLLM_KUNLUN_SHUTDOWN_TIMEOUT", raising=False)
    assert envs.VLLM_KUNLUN_SHUTDOWN_TIMEOUT == 10.0
    assert drain_seconds(10.0) == 2.0
    monkeypatch.setenv("VLLM_KUNLUN_SHUTDOWN_TIMEOUT", "0.1")
    with pytest.raises(envs.EnvVarError, match="at least 1"):
        envs.read("VLLM_KUNLUN_SHUTDOWN_TIMEOUT")
    assert os.environ["VLLM_KUNLUN_SHUTDOWN_TIMEOUT"] == "0.1"


def test_the_stop_begins_when_vllms_lifespan_deleted_the_app_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When the engine dies, vLLM's lifespan has run ``del app.state`` by the time
    ``serve_http`` returns: the wrapper used to read ``app.state`` then and exit through
    an AttributeError traceback, skipping the bounded stop."""
    import asyncio
    from types import SimpleNamespace

    from vllm_kunlun.guards import shutdown

    client = object()
    app = SimpleNamespace(state=SimpleNamespace(engine_client=client))

    async def serve_http(
        app: Any, sock: Any, enable_ssl_refresh: bool = False, **kw: Any
    ) -> str:
        del app.state  # what vLLM's lifespan does when serving ends
        return "shutdown"

    begun: list[object] = []
    monkeypatch.setattr(shutdown, "begin_stop", lambda c, bound=None: begun.append(c))
    wrapped = shutdown._make_bounded(serve_http)
    assert asyncio.run(wrapped(app, None)) == "shutdown"
    assert begun == [client]
