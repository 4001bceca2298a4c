"""Runtime patch ``sync_client_engine_death``: an offline ``LLM`` (and so
``vllm-kunlun demo``) whose engine core process dies raises ``EngineDeadError`` within
a second, instead of waiting forever.

Why: vLLM 0.15.1's ``SyncMPClient`` (the client of ``LLM`` with a separate engine core
process) blocks in ``get_output`` on its output queue and in ``call_utility`` on a
future. When the engine core dies (OOM-killed, a crash in a kernel), the client's
monitor thread logs "Engine core proc ... died unexpectedly", marks the engine dead and
shuts the client down, which stops the thread that fills the queue and the futures
without putting anything in them: ``LLM.generate`` and ``collective_rpc`` then wait for
ever (the demo printed that line and then nothing for minutes).
How: both methods wait in slices of ``POLL_S`` and, between slices, raise vLLM's own
``EngineDeadError`` once the monitor has marked the engine dead. ``get_output`` waits on
the queue's own condition and then hands over to vLLM's method, so an output that is
there is taken exactly as before; ``call_utility`` is vLLM's four lines with the
bounded wait in place of ``future.result()``.
Installed where engine arguments are parsed (``Phase.FRONT_END``), which includes every
process that builds an ``LLM``.
Removal: when vLLM's sync client wakes its waiters when the engine dies.
"""

from __future__ import annotations

import functools
import uuid
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from types import ModuleType
from typing import Any

from vllm_kunlun.patching.attribute import (
    AttributePatch,
    OptionalPatch,
    expect_call,
    expect_params,
)

NAME = "sync_client_engine_death"
MODULE = "vllm.v1.engine.core_client"
POLL_S = 0.5


def _dead(client: Any) -> bool:
    return bool(getattr(client.resources, "engine_dead", False))


def _engine_dead_error() -> Exception:
    from vllm.v1.engine.exceptions import EngineDeadError

    return EngineDeadError(suppress_context=True)


def wait_for_output(client: Any) -> None:
    """Return once the client's output queue holds something; raise EngineDeadError
    when the engine died first."""
    queue = client.outputs_queue
    with queue.not_empty:
        while not queue._qsize():
            if _dead(client):
                raise _engine_dead_error()
            queue.not_empty.wait(POLL_S)


def wait_for_result(client: Any, future: Future) -> Any:
    while True:
        try:
            return future.result(timeout=POLL_S)
        except FutureTimeout:
            if _dead(client):
                raise _engine_dead_error() from None


def _check_get_output(module: ModuleType, original: Any) -> str | None:
    return expect_params(original, "SyncMPClient.get_output", ("self",)) or (
        expect_call(original, "SyncMPClient.get_output", "outputs_queue")
    )


def _check_call_utility(module: ModuleType, original: Any) -> str | None:
    problem = expect_params(
        original, "SyncMPClient.call_utility", ("self", "method", "args")
    )
    for name in ("utility_results", "_send_input", "UTILITY", "result"):
        problem = problem or expect_call(original, "SyncMPClient.call_utility", name)
    return problem


def _make_get_output(original: Any) -> Any:
    @functools.wraps(original)
    def get_output(self: Any) -> Any:
        wait_for_output(self)
        return original(self)

    return get_output


def _make_call_utility(original: Any) -> Any:
    @functools.wraps(original)
    def call_utility(self: Any, method: str, *args: Any) -> Any:
        from vllm.v1.engine import EngineCoreRequestType

        call_id = uuid.uuid1().int >> 64
        future: Future[Any] = Future()
        self.utility_results[call_id] = future
        self._send_input(EngineCoreRequestType.UTILITY, (0, call_id, method, args))
        return wait_for_result(self, future)

    return call_utility


_PATCHES = (
    AttributePatch(
        NAME, MODULE, "SyncMPClient.get_output", _make_get_output, _check_get_output
    ),
    AttributePatch(
        NAME,
        MODULE,
        "SyncMPClient.call_utility",
        _make_call_utility,
        _check_call_utility,
    ),
)


GUARD = OptionalPatch(NAME, _PATCHES, "an LLM whose engine core dies may wait for ever")
install, installed, uninstall, RUNTIME_PATCHES = GUARD.bindings()
