"""Runtime patches ``engine_request_limits`` and ``openai_json_object_body``: a request
that asks for too much, or for a number that is not one, is a 400, not a dead server.

Why: vLLM 0.15.1 bounds ``n`` only from below. ``{"n": 1000000000}`` makes the API
server fan the request out into a billion child requests (``AsyncLLM.add_request``)
and the engine core queue them: both grow until the OOM killer ends the engine core,
and every later request is a 500 until a restart. ``temperature`` and
``repetition_penalty`` of NaN or infinity pass vLLM's range checks (a NaN compares
false), and the NaN row of the logits samples token 0: a 200 with an empty answer.
An integer of 2**64 (``top_k``, ``priority``, ``stop_token_ids``, ``n``) passes pydantic
and vLLM's checks and fails on its way to the engine core: an error with an empty
message and code 500. The guard bounds integers to int64, what the engine's tensors
and the request encoding hold. A body that is valid JSON but not an object (``[1,2,3]``,
``null``) reaches a model validator that calls ``data.get``: an AttributeError, a plain
500, and uvicorn drops the keep-alive connection.
How: ``InputProcessor.process_inputs`` (where the OpenAI server and ``LLM.generate``
both turn a request into an engine request, before the fan-out) is wrapped to refuse,
before vLLM's own checks, an ``n`` above the limit (``VLLM_KUNLUN_MAX_N``, default the
engine's ``max_num_seqs``: more siblings than the engine runs at once only queue),
a non-finite float and an integer outside int64 in any public sampling parameter, and
a ``priority`` outside int64. The refusal is vLLM's own ``VLLMValidationError`` naming
the parameter, so the server answers 400 with ``param`` set and ``LLM.generate``
raises a ``ValueError``. ``api_server.build_app`` is wrapped to add a small ASGI
middleware, inside vLLM's own (CORS, API key), that answers 400 to a JSON POST body
whose first byte is not ``{``: it reads only as far as that byte and hands every byte
on unchanged otherwise.
Installed with the engine guards (``KunlunPlatformBase.pre_register_and_update`` and
the general plugin); the body check only where vLLM's API server is already imported
(``vllm serve``), so an offline ``LLM`` never imports the web stack for it.
Removal: when vLLM bounds ``n``, refuses non-finite sampling parameters and answers a
non-object body with 400 itself.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from types import ModuleType
from typing import Any

from vllm.exceptions import VLLMValidationError

from vllm_kunlun import envs
from vllm_kunlun.guards.app_middleware import (
    API_SERVER,
    build_app_adding,
    check_build_app,
)
from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching.attribute import AttributePatch, expect_params

logger = init_logger(__name__)

NAME = "engine_request_limits"
BODY_NAME = "openai_json_object_body"
_PARAMS = (
    "self",
    "request_id",
    "prompt",
    "params",
    "arrival_time",
    "lora_request",
    "tokenization_kwargs",
    "trace_headers",
    "priority",
    "data_parallel_rank",
    "resumable",
)
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_N_ENV = "VLLM_KUNLUN_MAX_N"


class RequestLimitError(VLLMValidationError):
    """A request parameter beyond what the server accepts; names the parameter."""


def n_limit(max_num_seqs: int) -> int:
    """The largest ``n`` one request may ask for: ``VLLM_KUNLUN_MAX_N`` when set, else
    the engine's ``max_num_seqs`` (the most sequences it schedules at once)."""
    configured = envs.read(MAX_N_ENV)
    return int(configured) if configured is not None else int(max_num_seqs)


def check_n(n: int, limit: int) -> None:
    """Refuse ``n`` above ``limit``, before vLLM fans the request out into ``n``."""
    if n > limit:
        raise RequestLimitError(
            f"n={n} asks for more sequences than this server allows in one request: "
            f"n must be at most {limit} (the engine's max_num_seqs unless "
            f"{MAX_N_ENV} is set); send several requests or raise {MAX_N_ENV}",
            parameter="n",
            value=n,
        )


def check_number(field: str, value: Any) -> None:
    """Refuse a non-finite float or an integer outside int64 (bools are fine)."""
    if isinstance(value, bool):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise RequestLimitError(
            f"{field}={value} is not a finite number: sampling parameters must be "
            "finite (NaN and infinity are refused)",
            parameter=field,
            value=value,
        )
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
        raise RequestLimitError(
            f"{field}={value} does not fit in a 64-bit integer: it must be in "
            f"[{INT64_MIN}, {INT64_MAX}]",
            parameter=field,
            value=value,
        )


def check_sampling_values(params: Any) -> None:
    """Every number in the public fields of a ``SamplingParams`` (and one level into
    its lists and dicts: ``stop_token_ids``, ``logit_bias``), by the field's name."""
    for field in getattr(params, "__struct_fields__", ()):
        if field.startswith("_"):  # derived by vLLM from public fields
            continue
        value = getattr(params, field, None)
        if isinstance(value, dict):
            for key, item in value.items():
                check_number(f"{field}", key)
                check_number(f"{field}", item)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in value:
                check_number(field, item)
        else:
            check_number(field, value)


def check_request(params: Any, priority: Any, max_num_seqs: int) -> None:
    """All checks of one request: ``n``, then every sampling number, then priority.
    Pooling requests (no ``n``) get only the priority check."""
    check_number("priority", priority)
    if not hasattr(params, "temperature"):  # PoolingParams
        return
    check_sampling_values(params)
    check_n(int(params.n), n_limit(max_num_seqs))


def _check_target(module: ModuleType, original: Any) -> str | None:
    return expect_params(original, "InputProcessor.process_inputs", _PARAMS)


def _make_guard(original: Any) -> Any:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        params = bound.arguments.get("params")
        priority = bound.arguments.get("priority", 0)
        check_request(params, priority, self.vllm_config.scheduler_config.max_num_seqs)
        return original(self, *args, **kwargs)

    return guarded


PATCH = AttributePatch(
    NAME,
    "vllm.v1.engine.input_processor",
    "InputProcessor.process_inputs",
    _make_guard,
    _check_target,
)

# ---- the body of a JSON request must be an object ------------------------------------

_JSON_KINDS = {"[": "an array", '"': "a string", "n": "null", "t": "a boolean"}
_JSON_KINDS.update({"f": "a boolean", "-": "a number"})
_JSON_KINDS.update({d: "a number" for d in "0123456789"})
_WHITESPACE = b" \t\r\n"


def body_problem(head: bytes) -> str | None:
    """Why a JSON request body starting with ``head`` is not a JSON object, or None.

    ``head`` needs only reach the first non-whitespace byte: an object starts with
    ``{``. An empty body is left to vLLM (it answers that the body is missing).
    """
    text = head.lstrip(_WHITESPACE)
    if not text or text[:1] == b"{":
        return None
    first = text[:1].decode("latin-1")
    kind = _JSON_KINDS.get(first, "not JSON")
    got = f"got {kind}" if kind != "not JSON" else f"it starts with {first!r}"
    return (
        f"The request body must be a JSON object ({{...}} with the request's fields), "
        f"{got}"
    )


def _is_json(scope: MutableMapping[str, Any]) -> bool:
    for key, value in scope.get("headers", ()):
        if key == b"content-type":
            return bytes(value).split(b";")[0].strip().lower() == b"application/json"
    return False


Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class JsonObjectBody:
    """ASGI middleware: a JSON POST/PUT/PATCH body that is not an object gets vLLM's
    400 error shape; anything else passes through, byte for byte."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(
        self, scope: MutableMapping[str, Any], receive: Receive, send: Send
    ) -> None:
        if (
            scope.get("type") != "http"
            or scope.get("method") not in ("POST", "PUT", "PATCH")
            or not _is_json(scope)
        ):
            await self.app(scope, receive, send)
            return
        seen: list[MutableMapping[str, Any]] = []
        head = b""
        while True:  # only as far as the first non-whitespace byte
            message = await receive()
            seen.append(message)
            if message.get("type") != "http.request":
                break
            head += message.get("body", b"")
            if head.lstrip(_WHITESPACE) or not message.get("more_body", False):
                break
        problem = body_problem(head) if seen[-1].get("type") == "http.request" else None
        if problem is not None:
            last = seen[-1]
            while last.get("type") == "http.request" and last.get("more_body", False):
                last = await receive()  # drained, so the connection stays usable
            await _bad_request(send, problem)
            return

        async def replay() -> MutableMapping[str, Any]:
            return seen.pop(0) if seen else await receive()

        await self.app(scope, replay, send)


async def _bad_request(send: Send, message: str) -> None:
    """vLLM's ``ErrorResponse`` shape, so clients parse it like any other 400."""
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "BadRequestError",
                "param": "body",
                "code": 400,
            }
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


BODY_PATCH = AttributePatch(
    BODY_NAME,
    API_SERVER,
    "build_app",
    build_app_adding(JsonObjectBody),
    check_build_app,
)


def install_request_guard() -> bool:
    """The request guard; True when this call installed it. A vLLM whose method
    differs keeps its own checks, with a warning."""
    return PATCH.apply_or_warn("requests are checked by vLLM alone")


def install_body_check() -> bool:
    """The body check, only where vLLM's API server is imported (importing it only to
    patch it would cost seconds per process); True when this call installed it."""
    if API_SERVER not in sys.modules:
        return False
    return BODY_PATCH.apply_or_warn("a non-object JSON body is left to vLLM")


def install() -> bool:
    """Both of this module's patches; True when this call installed something."""
    return install_request_guard() | install_body_check()


# phases.apply_phase's hook (patching/phases.py)
RUNTIME_PATCHES = {
    NAME: lambda phase: install_request_guard(),
    BODY_NAME: lambda phase: install_body_check(),
}


def installed() -> bool:
    return PATCH.applied()


def uninstall() -> None:
    PATCH.revert()
    BODY_PATCH.revert()
