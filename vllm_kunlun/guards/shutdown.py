"""Runtime patch ``serve_shutdown_bound``: Ctrl-C or SIGTERM stops ``vllm serve``
within a bounded time, whatever its clients do, and every in-flight request fails with
an error its client sees.

Why: on SIGINT / SIGTERM vLLM 0.15.1's ``serve_http`` cancels the uvicorn server task
and returns uvicorn's ``Server.shutdown()`` unawaited; ``run_server_worker`` then shuts
the engine down (the engine core exits) and only afterwards awaits that shutdown.
Nothing tells the in-flight requests: each handler keeps awaiting its output queue,
which the dead engine never fills, and uvicorn, started without
``timeout_graceful_shutdown``, waits "for connections to close" for as long as that
takes, i.e. until each client gives up on its own (minutes). The clients get no error,
and a second Ctrl-C does nothing: uvicorn's own handler, which would force the exit,
is gone by then and vLLM's only cancels the already cancelled task again.
How: the patch wraps ``serve_http`` as ``run_server_worker`` calls it. It hands uvicorn
a graceful-shutdown timeout, and when ``serve_http`` returns (the server stops) it
(1) fails every request still in the front end's output processor with
``ServerShuttingDown`` (a non-streaming client gets a 503 naming the shutdown, a
streaming client an error event saying the same, then ``[DONE]``), before the engine
is shut down; (2) starts a deadline: if the process still runs
``VLLM_KUNLUN_SHUTDOWN_TIMEOUT`` seconds after the stop began, it kills every process
of its tree (engine core, workers) and exits with status 1; (3) makes a second SIGINT /
SIGTERM kill the tree and exit at once (status 128 + the signal). The process tree is
recorded when the stop begins, so workers whose engine core died first are still found.
The deadline is a thread: it covers the stop and the exit handlers, not the last phase
of the interpreter's teardown after a clean stop (Python lets no thread run then),
which can take several seconds on a loaded host.
Applied in the API server process only (where vLLM's OpenAI server module is already
imported), from the platform's ``pre_register_and_update`` and the general plugin.
Removal: when vLLM fails in-flight requests on shutdown and bounds its graceful wait.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
import time
from http import HTTPStatus
from types import FrameType, ModuleType
from typing import Any

from vllm_kunlun import envs
from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching.attribute import (
    AttributePatch,
    OptionalPatch,
    expect_call,
    expect_params,
)

logger = init_logger(__name__)

NAME = "serve_shutdown_bound"
MODULE = "vllm.entrypoints.openai.api_server"
_PARAMS = ("app", "sock", "enable_ssl_refresh", "uvicorn_kwargs")
DRAIN_FRACTION = 0.2
"""Share of the bound uvicorn waits for connections once their requests failed: a
client that reads gets its error at once; one that never reads is cut off then."""
SHUTDOWN_MESSAGE = (
    "the server is shutting down (it received SIGINT or SIGTERM): this request was "
    "aborted before it finished; send it again once the server is back"
)


def drain_seconds(bound: float) -> float:
    """How long uvicorn waits for open connections after the requests failed."""
    return bound * DRAIN_FRACTION


@functools.cache
def shutting_down_error() -> type[Exception]:
    """``ServerShuttingDown``, built on first use: importing vLLM's server modules at
    module level would load them wherever the plugin's guards are imported.

    An ``EngineDeadError``, so that ``AsyncLLM.generate`` re-raises it unchanged, and a
    ``GenerationError``, so that the completion and chat handlers answer it with its
    status (503) and message; as a bare ``EngineDeadError`` the route returns the
    error body with status 200.
    """
    from vllm.entrypoints.openai.engine.serving import GenerationError
    from vllm.v1.engine.exceptions import EngineDeadError

    class ServerShuttingDown(EngineDeadError, GenerationError):
        """The server stopped while this request was in flight."""

        def __init__(self) -> None:
            super().__init__()
            self.status_code = HTTPStatus.SERVICE_UNAVAILABLE

        def __str__(self) -> str:
            return SHUTDOWN_MESSAGE

    return ServerShuttingDown


def fail_in_flight(engine_client: Any) -> int:
    """Fail every request the front end still waits on; the number failed.

    ``AsyncLLM.generate`` re-raises an ``EngineDeadError`` from a request's queue as
    it is, and the OpenAI handlers turn it into an error response or event.
    """
    processor = getattr(engine_client, "output_processor", None)
    states = getattr(processor, "request_states", None)
    if processor is None or not states:
        return 0
    count = len(states)
    processor.propagate_error(shutting_down_error()())
    return count


class _Stop:
    """The stop in progress: its deadline and the processes it must not leave."""

    def __init__(self, bound: float) -> None:
        self.bound = bound
        self.started = time.monotonic()
        self.tree = _descendants()
        self.timer = threading.Timer(bound, self._deadline)
        self.timer.daemon = True  # a clean exit does not wait for it

    def arm(self) -> None:
        self.timer.start()
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self._second_signal)
        except ValueError:  # not the main thread: signals stay with whoever owns them
            logger.warning(
                "vllm-kunlun: the API server does not run in the main thread; a second "
                "Ctrl-C cannot end it early (the %g s deadline still holds)",
                self.bound,
            )

    def _second_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        self.exit_now(128 + signum, f"a second {name} during shutdown")

    def _deadline(self) -> None:
        self.exit_now(
            1,
            f"still running {self.bound:g} s after the stop began "
            "(VLLM_KUNLUN_SHUTDOWN_TIMEOUT)",
        )

    def exit_now(self, status: int, why: str) -> None:
        procs = {p.pid: p for p in [*self.tree, *_descendants()]}
        alive = [p for p in procs.values() if _running(p)]
        logger.warning(
            "vllm-kunlun: API server stops now (%s): killing %d remaining process(es) "
            "%s, exit status %d",
            why,
            len(alive),
            [p.pid for p in alive],
            status,
        )
        _kill(alive)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)


def _descendants() -> list[Any]:
    import psutil

    try:
        return list(psutil.Process().children(recursive=True))
    except psutil.Error:
        return []


def _running(proc: Any) -> bool:
    try:
        return bool(proc.is_running())
    except Exception:
        return False


def _kill(procs: list[Any]) -> None:
    import psutil

    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=2)


_active: list[_Stop] = []


def begin_stop(engine_client: Any, bound: float | None = None) -> _Stop:
    """The server stopped serving: fail its requests, start the deadline, make a
    second signal final. Once per process."""
    if _active:
        return _active[0]
    bound = envs.VLLM_KUNLUN_SHUTDOWN_TIMEOUT if bound is None else bound
    stop = _Stop(bound)
    _active.append(stop)
    stop.arm()
    failed = fail_in_flight(engine_client)
    logger.info(
        "vllm-kunlun: API server stopping: %d in-flight request(s) failed with "
        '"server is shutting down"; it exits within %g s '
        "(VLLM_KUNLUN_SHUTDOWN_TIMEOUT), a second Ctrl-C ends it at once",
        failed,
        bound,
    )
    return stop


def _check_target(module: ModuleType, original: Any) -> str | None:
    import inspect

    import uvicorn
    from vllm.v1.engine.output_processor import OutputProcessor

    if "timeout_graceful_shutdown" not in inspect.signature(uvicorn.Config).parameters:
        return f"uvicorn {uvicorn.__version__} has no timeout_graceful_shutdown"
    return (
        expect_params(original, "serve_http", _PARAMS)
        or expect_call(
            getattr(module, "run_server_worker", None),
            f"{MODULE}.run_server_worker",
            "serve_http",
        )
        or expect_params(
            getattr(OutputProcessor, "propagate_error", None),
            "OutputProcessor.propagate_error",
            ("self", "e"),
        )
    )


def _make_bounded(original: Any) -> Any:
    @functools.wraps(original)
    async def serve_http(
        app: Any, sock: Any, enable_ssl_refresh: bool = False, **uvicorn_kwargs: Any
    ) -> Any:
        bound = envs.VLLM_KUNLUN_SHUTDOWN_TIMEOUT
        uvicorn_kwargs.setdefault("timeout_graceful_shutdown", drain_seconds(bound))
        # Read now: vLLM's lifespan ends with ``del app.state``, which has run by the
        # time serving stops when the engine died.
        engine_client = getattr(getattr(app, "state", None), "engine_client", None)
        shutdown = await original(app, sock, enable_ssl_refresh, **uvicorn_kwargs)
        # Serving has stopped (a signal, or the watchdog saw the engine die); vLLM
        # shuts the engine down next, then awaits ``shutdown``.
        begin_stop(engine_client, bound)
        return shutdown

    return serve_http


PATCH = AttributePatch(NAME, MODULE, "serve_http", _make_bounded, _check_target)


# In an OpenAI API server process only (elsewhere its module is not imported).
GUARD = OptionalPatch(
    NAME,
    (PATCH,),
    "Ctrl-C / SIGTERM may wait for in-flight requests as long as their clients do",
    only_where=MODULE,
)
install, installed, uninstall, RUNTIME_PATCHES = GUARD.bindings()
