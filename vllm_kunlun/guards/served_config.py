"""Runtime patch ``openai_served_config``: ``GET /kunlun/served_config`` says what the
OpenAI server computes with (dtype, quantization, the checkpoint directory).

Why: ``vllm-kunlun accuracy`` judges a deployment by the precision it serves, and
vLLM 0.15.1 tells a client neither: ``/v1/models`` lists names and the directory
(``root``), ``/server_info`` exists only under ``VLLM_SERVER_DEV_MODE=1``. A float model
served under a W8A8 checkpoint's name would be judged by the checkpoint's thresholds.
How: ``api_server.build_app`` is wrapped to add an ASGI middleware that answers this
one path from ``app.state.vllm_config`` (set when the app's state is built) and passes
every other request on untouched. It reports settings only, nothing secret (no
environment, no API keys); it is behind vLLM's API-key layer like every route.
Installed with the engine guards where vLLM's API server is imported (``vllm serve``).
Removal: when vLLM's API reports the served dtype and quantization.
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

NAME = "openai_served_config"
PATH = "/kunlun/served_config"

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def served_config(vllm_config: Any) -> dict[str, Any]:
    """What the engine computes with, from vLLM's ``VllmConfig``."""
    model = vllm_config.model_config
    names = model.served_model_name
    spec = vllm_config.speculative_config
    return {
        "model": str(model.model),
        "served_model_names": [names] if isinstance(names, str) else list(names or []),
        "dtype": _dtype_name(model.dtype),
        "quantization": model.quantization,
        "kv_cache_dtype": str(vllm_config.cache_config.cache_dtype),
        "max_model_len": int(model.max_model_len),
        "speculative_method": None if spec is None else spec.method,
    }


class ServedConfig:
    """ASGI middleware: answers ``GET PATH`` with ``served_config``; every other
    request goes on to vLLM's app."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") != PATH:
            await self.app(scope, receive, send)
            return
        config = getattr(getattr(scope.get("app"), "state", None), "vllm_config", None)
        if scope.get("method") != "GET":
            status, doc = 405, {"error": {"message": f"{PATH} takes GET", "code": 405}}
        elif config is None:
            status = 503
            doc = {
                "error": {"message": "the engine is not configured yet", "code": 503}
            }
        else:
            status, doc = 200, served_config(config)
        body = json.dumps(doc).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


PATCH = AttributePatch(
    NAME, API_SERVER, "build_app", build_app_adding(ServedConfig), check_build_app
)
# Only where vLLM's API server is imported (``vllm serve``).
GUARD = OptionalPatch(
    NAME,
    (PATCH,),
    "the server does not say what dtype and quantization it serves",
    only_where=API_SERVER,
)
install, installed, uninstall, RUNTIME_PATCHES = GUARD.bindings()
