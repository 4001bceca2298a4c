"""Runtime patch ``openai_error_status``: vLLM's real app (``api_server.build_app``) and
its real chat and completion routes, with a serving handler that raises what the real
one raised in the attacks (an engine that died, a media URL that could not be fetched):
without the patch the error body comes with HTTP 200, with it the status is the
error's own; successful answers are untouched."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from vllm.entrypoints.openai import api_server
from vllm.entrypoints.openai.cli_args import FrontendArgs
from vllm.entrypoints.openai.engine.serving import OpenAIServing
from vllm.v1.engine.exceptions import EngineDeadError

from tests.conftest import patch_state
from vllm_kunlun.guards import error_status
from vllm_kunlun.guards.media import MediaFetchError

CHAT = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "x", "prompt": "hi"}


class RaisingHandler:
    """Stands where vLLM's serving object stands (``app.state.openai_serving_*``):
    vLLM's own ``create_error_response`` turns what it raises into the answer."""

    log_error_stack = False
    create_error_response = OpenAIServing.create_error_response

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def create_chat_completion(self, *args: Any) -> Any:
        raise self.exc

    async def create_completion(self, *args: Any) -> Any:
        raise self.exc


def _client(exc: Exception) -> TestClient:
    fields = {"model": "x", "served_model_name": None, "enable_log_requests": False}
    args = Namespace(**{"max_log_len": None, **fields, **vars(FrontendArgs())})
    app = api_server.build_app(args)
    app.state.openai_serving_chat = RaisingHandler(exc)
    app.state.openai_serving_completion = RaisingHandler(exc)
    app.state.enable_server_load_tracking = False
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture
def patched() -> Iterator[None]:
    with patch_state(error_status, on=True):
        yield


CASES = [
    (EngineDeadError(), 500, "InternalServerError"),
    (MediaFetchError("the media at http://x/a.png could not be fetched"), 400, "Bad"),
]


@pytest.mark.parametrize(("exc", "code", "kind"), CASES, ids=["engine_dead", "media"])
def test_without_the_patch_vllm_answers_errors_with_200(
    exc: Exception, code: int, kind: str
) -> None:
    was = error_status.installed()
    error_status.uninstall()
    try:
        resp = _client(exc).post("/v1/chat/completions", json=CHAT)
    finally:
        if was:
            error_status.install()
    assert resp.status_code == 200
    assert resp.json()["error"]["code"] == code


@pytest.mark.usefixtures("patched")
@pytest.mark.parametrize(("exc", "code", "kind"), CASES, ids=["engine_dead", "media"])
@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)],
    ids=["chat", "completion"],
)
def test_errors_carry_their_status(
    exc: Exception, code: int, kind: str, path: str, body: dict
) -> None:
    resp = _client(exc).post(path, json=body)
    assert resp.status_code == code, resp.text
    assert resp.json()["error"]["code"] == code
    assert kind in resp.json()["error"]["type"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"error": {"message": "m", "type": "BadRequestError", "code": 400}}', 400),
        (b'{"error": {"message": "m", "code": 503}}', 503),
        (b'{"error": {"message": "m", "code": 200}}', None),  # not an error status
        (b'{"error": {"code": 400}, "id": "cmpl-1"}', None),  # a result with a field
        (b'{"id": "cmpl-1", "choices": []}', None),
        (b'{"error": "text"}', None),
        (b'{"error": {"code": true}}', None),
        (b"not json", None),
    ],
)
def test_only_vllms_error_shape_changes_the_status(
    body: bytes, code: int | None
) -> None:
    assert error_status.error_status(body) == code
