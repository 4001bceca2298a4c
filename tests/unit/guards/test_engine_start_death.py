"""Runtime patch ``client_engine_start_death``: the client's wait for an engine's first
message, rebuilt without an engine: a ROUTER bound and polled as vLLM's
``MPClient.__init__`` does, ``launch_core_engines`` replaced by a context manager that
yields a real child process named as vLLM names an engine core.

Without the patch an engine that dies after the handshake and before the client binds
leaves the poll with nothing to read (vLLM waits 600 s); with it the dead engine's
message arrives within seconds and the error names the process and the cause. A live
engine gets nothing sent for it, nor does one that dies once the client is up."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import zmq
from vllm.utils.network_utils import get_open_zmq_ipc_path, make_zmq_socket

from vllm_kunlun.guards import engine_start_death as esd

LOGGER = "vllm.vllm_kunlun.guards.engine_start_death"


class _Manager:
    """What the watchdog reads of vLLM's CoreEngineProcManager."""

    def __init__(self, processes: list[Any]) -> None:
        self.processes = processes


class _Finalizer:
    alive = False


class _Engine:
    """A child process as the watchdog sees vLLM's engine core process: ``name``,
    ``pid``, ``sentinel`` (a pidfd: readable once it exits), ``join``, ``exitcode``
    (minus the signal that killed it). A subprocess, not a fork of this threaded one."""

    def __init__(self, rank: int) -> None:
        self.name = f"EngineCore_DP{rank}"
        self._popen = subprocess.Popen(["sleep", "60"])
        self.pid = self._popen.pid
        self.sentinel = os.pidfd_open(self.pid)

    def join(self, timeout: float | None = None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout)

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()


@contextlib.contextmanager
def _engines(*ranks: int) -> Iterator[list[Any]]:
    procs = [_Engine(rank) for rank in ranks]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
            proc.join(5)
            os.close(proc.sentinel)


def _launcher(manager: Any, address: str) -> Any:
    """vLLM's ``launch_core_engines`` in shape: the block runs inside the handshake."""

    @contextlib.contextmanager
    def launch_core_engines(
        vllm_config: Any, executor_class: Any, log_stats: bool, num_api_servers: int = 1
    ) -> Iterator[tuple[Any, Any, Any]]:
        yield manager, None, SimpleNamespace(inputs=[address], outputs=["unused"])

    return launch_core_engines


@contextlib.contextmanager
def _client_socket(address: str) -> Iterator[zmq.Socket]:
    """The client's input socket, bound as vLLM binds it."""
    ctx = zmq.Context()
    sock = make_zmq_socket(ctx, address, zmq.ROUTER, bind=True)
    try:
        yield sock
    finally:
        sock.close(linger=0)
        ctx.term()


def _first_message(sock: zmq.Socket, within_s: float) -> list[bytes] | None:
    """What vLLM's wait would receive within ``within_s`` seconds, else None."""
    if not sock.poll(timeout=int(within_s * 1000)):
        return None
    return list(sock.recv_multipart())


@contextlib.contextmanager
def _errors() -> Iterator[list[str]]:
    got: list[str] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = lambda record: got.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger(LOGGER)
    logger.addHandler(handler)
    try:
        yield got
    finally:
        logger.removeHandler(handler)


def _launch(manager: Any, address: str, patched: bool) -> None:
    launch = _launcher(manager, address)
    if patched:
        launch = esd._make_launch(launch)
    with launch(None, None, False) as launched:
        assert launched[0] is manager


def _client_up(manager: Any) -> None:
    """The client's wait is over: it starts its engine monitor (stubbed)."""
    started: list[Any] = []
    monitor = esd._make_start_monitor(started.append)
    client = SimpleNamespace(resources=SimpleNamespace(engine_manager=manager))
    dog = esd._WATCHDOGS.get(manager)
    monitor(client)
    assert started == [client]
    if dog is not None:  # it stops within its poll interval
        dog.thread.join(5)
        assert not dog.thread.is_alive()


def test_without_the_patch_a_dead_engine_leaves_the_wait_empty() -> None:
    address = get_open_zmq_ipc_path()
    with _engines(0) as (proc,):
        manager = _Manager([proc])
        _launch(manager, address, patched=False)
        os.kill(proc.pid, signal.SIGKILL)  # after READY, before the client binds
        proc.join(5)
        with _client_socket(address) as sock:
            assert _first_message(sock, 2.0) is None  # vLLM polls on, for 600 s


@pytest.mark.parametrize("bind_first", [False, True])
@pytest.mark.parametrize(
    "death, cause",
    [
        (signal.SIGKILL, "killed by SIGKILL: most likely the out-of-memory killer"),
        (signal.SIGTERM, "killed by SIGTERM"),
    ],
)
def test_a_dead_engine_ends_the_wait_within_seconds(
    death: int, cause: str, bind_first: bool
) -> None:
    address = get_open_zmq_ipc_path()
    with _engines(0) as (proc,), _errors() as errors:
        manager = _Manager([proc])
        _launch(manager, address, patched=True)
        dog = esd._WATCHDOGS[manager]
        with contextlib.ExitStack() as stack:
            sock = stack.enter_context(_client_socket(address)) if bind_first else None
            os.kill(proc.pid, death)
            if sock is None:
                proc.join(5)  # dead before the client binds: the reported case
                sock = stack.enter_context(_client_socket(address))
            start = time.monotonic()
            got = _first_message(sock, 10.0)
            assert got == [b"\x00\x00", b""]  # rank 0's identity, the empty message
            assert time.monotonic() - start < 5.0
            _client_up(manager)
        dog.thread.join(5)
        assert not dog.thread.is_alive()
    (error,) = errors
    assert f"EngineCore_DP0 (pid {proc.pid})" in error
    assert cause in error
    assert "VLLM_ENGINE_READY_TIMEOUT_S" in error


def test_only_the_dead_engine_is_spoken_for() -> None:
    address = get_open_zmq_ipc_path()
    with _engines(0, 3) as procs, _client_socket(address) as sock, _errors() as errs:
        manager = _Manager(procs)
        _launch(manager, address, patched=True)
        os.kill(procs[1].pid, signal.SIGKILL)
        assert _first_message(sock, 10.0) == [(3).to_bytes(2, "little"), b""]
        assert _first_message(sock, 1.0) is None  # nothing for the live rank 0
        _client_up(manager)
    assert len(errs) == 1 and "EngineCore_DP3" in errs[0]


def test_nothing_is_sent_for_a_live_engine_nor_once_the_client_is_up() -> None:
    address = get_open_zmq_ipc_path()
    with _engines(0) as (proc,), _client_socket(address) as sock, _errors() as errs:
        manager = _Manager([proc])
        _launch(manager, address, patched=True)
        dog = esd._WATCHDOGS[manager]
        assert _first_message(sock, 1.5) is None
        _client_up(manager)
        dog.thread.join(5)
        assert not dog.thread.is_alive()
        # vLLM's own monitor handles a death from here on.
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(5)
        assert _first_message(sock, 1.5) is None
    assert errs == [] and dog.spoken_for == []
    assert manager not in esd._WATCHDOGS


def test_engines_the_client_closed_itself_are_not_spoken_for() -> None:
    """A client whose start failed closes its engines: no death to report."""
    address = get_open_zmq_ipc_path()
    with _engines(0) as (proc,), _client_socket(address) as sock, _errors() as errs:
        manager = _Manager([proc])
        _launch(manager, address, patched=True)
        dog = esd._WATCHDOGS[manager]
        manager._finalizer = _Finalizer()  # type: ignore[attr-defined]
        os.kill(proc.pid, signal.SIGTERM)
        dog.thread.join(5)
        assert not dog.thread.is_alive()
        assert _first_message(sock, 1.0) is None
    assert errs == []


def test_the_watch_is_bounded() -> None:
    address = get_open_zmq_ipc_path()
    with _engines(0) as (proc,):
        manager = _Manager([proc])
        dog = esd.watch((manager, None, SimpleNamespace(inputs=[address])), 0.3)
        assert dog is not None
        dog.thread.join(5)
        assert not dog.thread.is_alive()
    # Nothing to watch: Ray actors (no processes), several API servers' inputs.
    assert esd.watch((SimpleNamespace(), None, SimpleNamespace(inputs=["a"]))) is None
    two = SimpleNamespace(inputs=["a", "b"])
    assert esd.watch((_Manager([object()]), None, two)) is None


def test_identities_and_causes() -> None:
    assert esd.engine_identity(SimpleNamespace(name="EngineCore_DP0")) == b"\x00\x00"
    assert esd.engine_identity(SimpleNamespace(name="EngineCore_DP258")) == b"\x02\x01"
    assert esd.engine_identity(SimpleNamespace(name="Worker")) is None
    assert "out-of-memory killer" in esd.exit_cause(-9)
    assert esd.exit_cause(3) == "it exited with status 3: its log above says why"
    assert esd.exit_cause(None) == "its exit code is unknown"


def test_the_targets_match_vllm() -> None:
    for patch in esd._PATCHES:
        assert patch.mismatch() is None, patch.target
