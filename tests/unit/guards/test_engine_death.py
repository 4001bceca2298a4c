"""Runtime patch ``sync_client_engine_death``: vLLM's own ``SyncMPClient.get_output``
and ``call_utility``, wrapped, raise vLLM's ``EngineDeadError`` within about a second of
the client's monitor marking the engine dead (it stops the thread that would have woken
them); without the patch they wait for ever. Outputs and results that arrive are handed
over as before."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from vllm.v1.engine.core_client import SyncMPClient
from vllm.v1.engine.exceptions import EngineDeadError

from tests.conftest import patch_state
from vllm_kunlun.guards import engine_death


def _client() -> SimpleNamespace:
    sent: list[Any] = []
    return SimpleNamespace(
        outputs_queue=queue.Queue(),
        resources=SimpleNamespace(engine_dead=False),
        utility_results={},
        engines_running=True,
        _send_input=lambda kind, payload: sent.append(payload),
        sent=sent,
    )


def _outcome(call: Callable[[], Any], within: float) -> Any:
    """What ``call`` returned or raised within ``within`` seconds, else "blocked"."""
    got: list[Any] = []

    def run() -> None:
        try:
            got.append(call())
        except BaseException as exc:
            got.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(within)
    return got[0] if got else "blocked"


def _die_soon(client: SimpleNamespace) -> None:
    threading.Timer(0.2, lambda: setattr(client.resources, "engine_dead", True)).start()


def test_without_the_patch_a_dead_engine_blocks_both_waits() -> None:
    client = _client()
    # vLLM's own waits, whatever an earlier test in this process left applied.
    with patch_state(engine_death, on=False):
        get_output, call_utility = SyncMPClient.get_output, SyncMPClient.call_utility
    _die_soon(client)
    assert _outcome(lambda: get_output(client), 2.0) == "blocked"
    assert _outcome(lambda: call_utility(client, "m"), 2.0) == "blocked"


@pytest.mark.parametrize("wait", ["get_output", "call_utility"])
def test_a_dead_engine_raises_engine_dead_error_within_a_second(wait: str) -> None:
    client = _client()
    wrapped = (
        engine_death._make_get_output(SyncMPClient.get_output)
        if wait == "get_output"
        else engine_death._make_call_utility(SyncMPClient.call_utility)
    )
    args = () if wait == "get_output" else ("collective_rpc",)
    _die_soon(client)
    start = time.monotonic()
    got = _outcome(lambda: wrapped(client, *args), 5.0)
    assert isinstance(got, EngineDeadError), got
    assert time.monotonic() - start < 0.2 + engine_death.POLL_S + 1.0


def test_outputs_and_results_that_arrive_are_handed_over() -> None:
    client = _client()
    output = SimpleNamespace(wave_complete=None)
    threading.Timer(0.1, lambda: client.outputs_queue.put(output)).start()
    get = engine_death._make_get_output(SyncMPClient.get_output)
    assert _outcome(lambda: get(client), 5.0) is output

    call = engine_death._make_call_utility(SyncMPClient.call_utility)

    def answer() -> None:
        while not client.utility_results:
            time.sleep(0.01)
        (future,) = client.utility_results.values()
        future.set_result("answer")

    threading.Thread(target=answer, daemon=True).start()
    assert _outcome(lambda: call(client, "m", 1), 5.0) == "answer"
    assert client.sent[0][2:] == ("m", (1,))


def test_the_targets_match_vllm() -> None:
    for patch in engine_death._PATCHES:
        assert patch.mismatch() is None, patch.target
