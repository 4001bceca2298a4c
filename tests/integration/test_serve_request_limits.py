"""Request limits against a real ``vllm serve`` in host emulation (one server for the
module): each request the adversarial run found harmful is a 400 naming the field and
the limit, on a keep-alive connection that then serves a normal completion, with the
engine core still alive.

``n`` is first sent one above the limit (``--max-num-seqs``); the billion of the
original report is sent only once that smaller one was refused, so a server without
the guard fails the test instead of filling the machine's memory.
"""

from __future__ import annotations

import http.client
import json
import math
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from tests.conftest import child_env
from vllm_kunlun.demo.server_process import HOST, ServerProcess, start_server
from vllm_kunlun.demo.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow

NAME = "tiny"
MAX_NUM_SEQS = 8
TIMEOUT = 120.0  # seconds, per request
NORMAL = {"model": NAME, "prompt": "the quick brown fox", "max_tokens": 4}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    model = write_tiny_model(tmp_path_factory.mktemp("limits") / "tiny-qwen3")
    args = [
        "--served-model-name",
        NAME,
        "--dtype",
        "float32",
        "--max-model-len",
        "256",
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
    ]
    env = child_env({"VLLM_KUNLUN_HOST_EMULATION": "1"})
    srv = start_server(str(model), args, env, log_dir=tmp_path_factory.mktemp("log"))
    try:
        yield srv
    finally:
        srv.stop()


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


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    c = Client(server)
    yield c
    c.conn.close()


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


def test_n_above_max_num_seqs_is_refused_and_a_billion_too(
    server: ServerProcess, client: Client
) -> None:
    status, answer = client.post("/v1/completions", completion(n=MAX_NUM_SEQS))
    assert status == 200 and len(answer["choices"]) == MAX_NUM_SEQS, answer
    status, answer = client.post("/v1/completions", completion(n=MAX_NUM_SEQS + 1))
    assert status == 400, answer  # stop here on a server without the limit
    assert_refused(answer, "n", f"n={MAX_NUM_SEQS + 1}", f"at most {MAX_NUM_SEQS}")
    assert_refused(answer, "n", "VLLM_KUNLUN_MAX_N")
    status, answer = client.post("/v1/completions", completion(n=1_000_000_000))
    assert status == 400, answer
    assert_refused(answer, "n", "n=1000000000", f"at most {MAX_NUM_SEQS}")
    assert_still_serving(server, client)


BAD_NUMBERS: dict[str, tuple[dict[str, Any], str, str]] = {
    "temperature NaN": ({"temperature": math.nan}, "temperature", "not a finite"),
    "temperature inf": ({"temperature": math.inf}, "temperature", "not a finite"),
    "repetition_penalty NaN": (
        {"repetition_penalty": math.nan},
        "repetition_penalty",
        "not a finite",
    ),
    "top_k 2**64": ({"top_k": 2**64}, "top_k", "64-bit integer"),
    "priority 2**64": ({"priority": 2**64}, "priority", "64-bit integer"),
    "stop_token_ids 2**64": (
        {"stop_token_ids": [2**64]},
        "stop_token_ids",
        "64-bit integer",
    ),
}


@pytest.mark.parametrize("case", list(BAD_NUMBERS))
def test_unrepresentable_numbers_are_refused(
    server: ServerProcess, client: Client, case: str
) -> None:
    fields, param, words = BAD_NUMBERS[case]
    status, answer = client.post("/v1/completions", completion(**fields))
    assert status == 400, answer
    assert_refused(answer, param, words)
    assert_still_serving(server, client)


def test_chat_completions_are_checked_too(
    server: ServerProcess, client: Client
) -> None:
    body = {
        "model": NAME,
        "messages": [{"role": "user", "content": "what is the sea ?"}],
        "max_tokens": 4,
        "temperature": math.nan,
    }
    status, answer = client.post("/v1/chat/completions", json.dumps(body).encode())
    assert status == 400, answer
    assert_refused(answer, "temperature", "not a finite")
    assert_still_serving(server, client)


@pytest.mark.parametrize(
    ("body", "kind"), [(b"[1,2,3]", "got an array"), (b"null", "got null")]
)
def test_a_body_that_is_not_an_object_is_a_400_on_a_kept_connection(
    server: ServerProcess, client: Client, body: bytes, kind: str
) -> None:
    status, answer = client.post("/v1/completions", body)
    assert status == 400, answer
    assert_refused(answer, "body", "must be a JSON object", kind)
    assert_still_serving(server, client)
