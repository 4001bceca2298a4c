"""One way to put an ASGI middleware into vLLM's OpenAI app: wrap
``api_server.build_app`` so the app it returns has the middleware innermost of the user
middleware (after vLLM's API-key and CORS layers).

Why here: the guards that answer in HTTP (a non-object JSON body, an error's status)
each add one middleware; the wrapper and its target check are the same for all.
vLLM's ``build_app`` ends in the SageMaker bootstrap, which builds the middleware stack
from ``user_middleware``; the stack is built again the same way, with ours in it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from vllm_kunlun.patching.attribute import expect_params

API_SERVER = "vllm.entrypoints.openai.api_server"


def check_build_app(module: ModuleType, original: Any) -> str | None:
    return expect_params(original, "api_server.build_app", ("args",))


def build_app_adding(middleware: Any) -> Callable[[Any], Any]:
    """The ``make`` of an ``AttributePatch`` of ``api_server.build_app`` that adds
    ``middleware`` to every app vLLM builds."""

    def make(original: Any) -> Any:
        @functools.wraps(original)
        def build_app(args: Any) -> Any:
            app = original(args)
            from starlette.middleware import Middleware

            app.user_middleware.append(Middleware(middleware))
            if app.middleware_stack is not None:
                app.middleware_stack = app.build_middleware_stack()
            return app

        return build_app

    return make
