"""Runtime patch ``openai_error_status``: an error answer of the OpenAI server carries
its error's HTTP status, not 200.

Why: vLLM 0.15.1's chat and completion routes catch what their handler raises and
*return* ``handler.create_error_response(exc)``, a pydantic ``ErrorResponse``, from the
route; FastAPI serializes a returned model with the route's default status, 200. So an
unreachable or slow image URL, a dead engine (``EngineDeadError``) or a video sent as a
list of frames answers ``200 {"error": {..., "code": 500}}``: a client or a load
balancer that reads the status sees success.
How: ``api_server.build_app`` is wrapped to add an ASGI middleware, inside vLLM's own,
that looks at complete JSON answers sent with status 200: when the body is exactly
vLLM's error shape (one key, ``error``, whose ``code`` is an HTTP error status), the
status line becomes that code. Every other answer, streamed ones included, passes
unchanged and unbuffered (a JSON answer is one body message).
Installed with the engine guards where vLLM's API server is imported (``vllm serve``).
Removal: when vLLM's routes answer errors with their status.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from vllm_kunlun.guards.app_middleware import (
    API_SERVER,
    build_app_adding,
    check_build_app,
)
from vllm_kunlun.patching.attribute import AttributePatch, OptionalPatch

NAME = "openai_error_status"
# An error body is small; a larger 200 answer is a result, not an error.
_MAX_ERROR_BODY = 1 << 16

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def error_status(body: bytes) -> int | None:
    """The HTTP status an answer body names when it is exactly vLLM's error shape
    (``{"error": {"code": 4xx/5xx, ...}}``), else None."""
    if len(body) > _MAX_ERROR_BODY or not body.lstrip().startswith(b'{"error"'):
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict) or set(doc) != {"error"}:
        return None
    error = doc["error"]
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
        return code
    return None


def _is_json(message: Message) -> bool:
    for key, value in message.get("headers", ()):
        if bytes(key).lower() == b"content-type":
            return bytes(value).split(b";")[0].strip().lower() == b"application/json"
    return False


class ErrorStatus:
    """ASGI middleware: a 200 JSON answer that is vLLM's error shape gets the error's
    status; every other answer passes through unchanged."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        held: list[Message] = []

        async def send_checked(message: Message) -> None:
            kind = message.get("type")
            if kind == "http.response.start":
                if message.get("status") == 200 and _is_json(message):
                    held.append(message)  # until the body shows what it is
                    return
            elif kind == "http.response.body" and held:
                start = held.pop()
                if not message.get("more_body", False):
                    code = error_status(message.get("body", b""))
                    if code is not None:
                        start = {**start, "status": code}
                await send(start)
            await send(message)

        await self.app(scope, receive, send_checked)


PATCH = AttributePatch(
    NAME, API_SERVER, "build_app", build_app_adding(ErrorStatus), check_build_app
)
# Only where vLLM's API server is imported (``vllm serve``).
GUARD = OptionalPatch(
    NAME, (PATCH,), "error answers keep vLLM's status 200", only_where=API_SERVER
)
install, installed, uninstall, RUNTIME_PATCHES = GUARD.bindings()
