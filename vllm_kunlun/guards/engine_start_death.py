"""Runtime patch ``client_engine_start_death``: an engine core that dies between its
startup handshake and the client's first contact ends the start within seconds, with
an error naming the dead process and its likely cause, instead of a 10-minute wait.

Why: vLLM 0.15.1's ``MPClient.__init__`` (the client of ``LLM`` and of ``vllm serve``)
launches the engine cores, waits for their READY handshake, then binds its input socket
and polls it for each engine's first (empty) message, for ``VLLM_ENGINE_READY_TIMEOUT_S``
(600 s), without looking at the engine processes. An engine queues that message before
it sends READY, so a live engine's message arrives as soon as the client binds; an
engine killed in between (the OOM killer while the model settles) takes its queued
message with it, and the client waits the full 600 s. vLLM's own engine monitor, which
would notice the death, starts only after that wait.

How: ``launch_core_engines`` as ``core_client`` calls it is wrapped; once the handshake
is over, a daemon watchdog waits on the engine processes' sentinels. If one dies before
the client starts its engine monitor (``MPClient.start_engine_core_monitor``, also
wrapped, stops the watchdog), the watchdog logs an error naming the process, its exit
code and the likely cause, and sends the dead engine's empty message to the client's
input address from a DEALER with that engine's identity. The client's wait ends, it
starts its monitor, which sees the dead process at once, marks the engine dead and shuts
the client down; the next call raises vLLM's ``EngineDeadError``.

Safety: the watchdog speaks only for a process that has exited, whose identity no live
peer can hold. A message that arrives after the client's wait (the engine died in the
microseconds between its real message and the monitor's start) is never read: the
client reads its input socket only in that wait (and in Ray's elastic scale-up, which
ignores identities it does not expect). With several engines (data parallel), an engine
whose real message was already taken and which dies while another is still starting
makes the client's wait raise ``KeyError`` instead of waiting: the start fails either
way, and the error above names the engine. Engines vLLM launches elsewhere (Ray actors,
``vllm serve --api-server-count`` > 1) are not watched.
Installed where engine arguments are parsed (``Phase.FRONT_END``): ``LLM`` and the API
server.
Removal: when vLLM's client checks the engine processes while it waits for them.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing.connection
import re
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from vllm_kunlun.patching.attribute import (
    AttributePatch,
    OptionalPatch,
    expect_call,
    expect_caller,
    expect_params,
)

NAME = "client_engine_start_death"
MODULE = "vllm.v1.engine.core_client"
POLL_S = 0.1  # how often the watchdog looks whether the client is up
WATCH_S = 900.0  # the longest it watches (vLLM's wait is 600 s by default)
_ENGINE_NAME = re.compile(r"EngineCore_DP(\d+)$")

# engine manager -> its watchdog, until the client starts its own monitor.
_WATCHDOGS: weakref.WeakKeyDictionary[Any, Watchdog] = weakref.WeakKeyDictionary()


def _logger() -> Any:
    from vllm_kunlun.logger import init_logger

    return init_logger(__name__)


def engine_identity(process: Any) -> bytes | None:
    """The ZMQ identity the client expects from ``process`` (vLLM names an engine core
    ``EngineCore_DP<rank>`` and the client knows it as ``rank.to_bytes(2, "little")``),
    or None for a name that does not say."""
    found = _ENGINE_NAME.search(str(getattr(process, "name", "")))
    return int(found.group(1)).to_bytes(2, "little") if found else None


def exit_cause(exitcode: int | None) -> str:
    """What an engine core's exit code says about why it died."""
    if exitcode is None:
        return "its exit code is unknown"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        if -exitcode == signal.SIGKILL:
            return (
                f"killed by {name}: most likely the out-of-memory killer (see `dmesg`; "
                "free host memory, or lower --max-model-len or --max-num-seqs), or "
                "another process killed it"
            )
        return f"killed by {name}"
    return f"it exited with status {exitcode}: its log above says why"


class Watchdog:
    """Watches ``processes`` from the end of the handshake until the client starts its
    engine monitor (``stop``), for at most ``limit_s``; speaks for each one that dies."""

    def __init__(
        self,
        manager: Any,
        processes: list[Any],
        input_address: str,
        limit_s: float = WATCH_S,
    ) -> None:
        self._manager = weakref.ref(manager)
        self.processes = list(processes)
        self.input_address = input_address
        self.limit_s = limit_s
        self.spoken_for: list[bytes] = []
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._ctx: Any = None
        self._sockets: list[Any] = []
        self.thread = threading.Thread(
            target=self._run, name="KunlunEngineStartWatchdog", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """The client is up (or gone): never speak again."""
        with self._lock:
            self._stopped.set()

    def _closed_on_purpose(self) -> bool:
        """The client's own clean-up closed the engines (its start failed)."""
        manager = self._manager()
        finalizer = getattr(manager, "_finalizer", None)
        return manager is None or not getattr(finalizer, "alive", True)

    def _run(self) -> None:
        deadline = time.monotonic() + self.limit_s
        waiting: dict[Any, Any] = {p.sentinel: p for p in self.processes}
        try:
            while waiting and not self._stopped.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                ready = multiprocessing.connection.wait(
                    list(waiting), timeout=min(POLL_S, left)
                )
                for sentinel in ready:
                    process = waiting.pop(sentinel)
                    process.join(timeout=1.0)  # reaped: its exit code is known
                    with self._lock:
                        if self._stopped.is_set() or self._closed_on_purpose():
                            return
                        self._speak_for(process)
            # Every engine is dead: keep what was sent deliverable until the client
            # has read it and started its monitor.
            if self._sockets:
                self._stopped.wait(max(0.0, deadline - time.monotonic()))
        finally:
            self._close()

    def _speak_for(self, process: Any) -> None:
        exitcode = process.exitcode
        identity = engine_identity(process)
        _logger().error(
            "vllm-kunlun: engine core process %s (pid %s) died after its startup "
            "handshake, before the client heard from it: %s. Ending the client's "
            "wait for it (VLLM_ENGINE_READY_TIMEOUT_S, up to %s s) now.",
            process.name,
            process.pid,
            exit_cause(exitcode),
            _ready_timeout_s(),
        )
        if identity is None:
            return
        import zmq

        try:
            if self._ctx is None:
                self._ctx = zmq.Context()
            socket = self._ctx.socket(zmq.DEALER)
            self._sockets.append(socket)
            socket.setsockopt(zmq.IDENTITY, identity)
            socket.connect(self.input_address)
            socket.send(b"")
        except zmq.ZMQError as exc:
            _logger().warning(
                "vllm-kunlun: could not end the client's wait for %s (%s): it waits "
                "until VLLM_ENGINE_READY_TIMEOUT_S",
                process.name,
                exc,
            )
            return
        self.spoken_for.append(identity)

    def _close(self) -> None:
        for socket in self._sockets:
            socket.close(linger=0)
        self._sockets.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None


def _ready_timeout_s() -> Any:
    return getattr(sys.modules.get(MODULE), "VLLM_ENGINE_READY_TIMEOUT_S", 600)


def watch(launched: tuple[Any, Any, Any], limit_s: float = WATCH_S) -> Watchdog | None:
    """Start the watchdog over what ``launch_core_engines`` launched, if it launched
    engine processes here for one client input address."""
    manager, _coordinator, addresses = launched
    processes = list(getattr(manager, "processes", None) or ())
    inputs = list(getattr(addresses, "inputs", None) or ())
    if not processes or len(inputs) != 1:
        return None
    dog = Watchdog(manager, processes, inputs[0], limit_s)
    _WATCHDOGS[manager] = dog
    dog.start()
    return dog


def stop_watching(manager: Any) -> None:
    """The client is up: the watchdog of ``manager``'s engines stops."""
    if manager is None:
        return
    with contextlib.suppress(TypeError):  # a manager that takes no weak reference
        dog = _WATCHDOGS.pop(manager, None)
        if dog is not None:
            dog.stop()


def _make_launch(original: Any) -> Any:
    @functools.wraps(original)
    @contextlib.contextmanager
    def launch_core_engines(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with original(*args, **kwargs) as launched:
            yield launched
        # The handshake is over (the block above waited for READY): watch the engines
        # until the client has heard from them.
        watch(launched)

    return launch_core_engines


def _make_start_monitor(original: Any) -> Any:
    @functools.wraps(original)
    def start_engine_core_monitor(self: Any) -> Any:
        stop_watching(getattr(self.resources, "engine_manager", None))
        return original(self)

    return start_engine_core_monitor


def _check_launch(module: ModuleType, original: Any) -> str | None:
    problem = expect_params(
        original,
        "launch_core_engines",
        ("vllm_config", "executor_class", "log_stats", "num_api_servers"),
    )
    for name in ("launch_core_engines", "poll", "recv_multipart"):
        problem = problem or expect_caller(module, "MPClient.__init__", name)
    return problem or expect_caller(
        module, "MPClient.__init__", "start_engine_core_monitor"
    )


def _check_start_monitor(module: ModuleType, original: Any) -> str | None:
    problem = expect_params(original, "MPClient.start_engine_core_monitor", ("self",))
    for name in ("engine_manager", "processes"):
        problem = problem or expect_call(
            original, "MPClient.start_engine_core_monitor", name
        )
    return problem


_PATCHES = (
    AttributePatch(NAME, MODULE, "launch_core_engines", _make_launch, _check_launch),
    AttributePatch(
        NAME,
        MODULE,
        "MPClient.start_engine_core_monitor",
        _make_start_monitor,
        _check_start_monitor,
    ),
)


GUARD = OptionalPatch(
    NAME,
    _PATCHES,
    "an engine core that dies right after its startup handshake leaves the client "
    "waiting up to VLLM_ENGINE_READY_TIMEOUT_S (600 s)",
)
install, installed, uninstall, RUNTIME_PATCHES = GUARD.bindings()
