"""Runtime patch ``guided_fields_refused``: a request with the ``guided_*`` fields of
older vLLM releases is a 400 naming the field and its replacement.

Why: vLLM 0.15.1 removed ``guided_json``, ``guided_regex``, ``guided_choice`` and
``guided_grammar`` from its OpenAI request models, which accept unknown fields: such a
request is served *unconstrained*, with only a server-side warning ("fields were present
in the request but ignored"). A client written for an older vLLM (or the upstream
Kunlun plugin's examples) gets free text where it asked for JSON, and no error to tell
it why.
How: ``OpenAIServingChat.create_chat_completion`` and
``OpenAIServingCompletion.create_completion`` are wrapped: when the parsed request holds
one of these fields among its extra (unknown) fields, the handler answers vLLM's own
``create_error_response`` (400, ``param`` set to the field) naming the replacement
(``structured_outputs`` / ``response_format``) instead of generating. Other requests are
untouched. Installed with the engine guards where vLLM's API server is imported
(``vllm serve``).
Removal: when vLLM refuses unknown request fields, or the validated vLLM is one that
still reads them.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from vllm_kunlun.guards.app_middleware import API_SERVER
from vllm_kunlun.patching.attribute import AttributePatch, OptionalPatch, expect_params

NAME = "guided_fields_refused"
CHAT = "vllm.entrypoints.openai.chat_completion.serving"
COMPLETION = "vllm.entrypoints.openai.completion.serving"

# field -> what to send instead (vLLM 0.15.1's request fields).
REPLACEMENTS = {
    "guided_json": (
        '"structured_outputs": {"json": <schema>} or "response_format": '
        '{"type": "json_schema", "json_schema": {"name": ..., "schema": <schema>}}'
    ),
    "guided_regex": '"structured_outputs": {"regex": <regex>}',
    "guided_choice": '"structured_outputs": {"choice": [...]}',
    "guided_grammar": '"structured_outputs": {"grammar": <EBNF>}',
}


def guided_field_problem(extra: dict[str, Any] | None) -> tuple[str, str] | None:
    """(field, message) for the first removed ``guided_*`` field in a request's extra
    fields, or None."""
    for field in REPLACEMENTS:
        if extra and field in extra:
            return field, (
                f"'{field}' is not a request field of this vLLM (0.15.1 removed it; "
                "the request would be served unconstrained). Send "
                f"{REPLACEMENTS[field]} instead."
            )
    return None


def _make(original: Any) -> Any:
    @functools.wraps(original)
    async def create(self: Any, request: Any, raw_request: Any = None) -> Any:
        found = guided_field_problem(getattr(request, "model_extra", None))
        if found is not None:
            field, message = found
            return self.create_error_response(message, param=field)
        return await original(self, request, raw_request)

    return create


def _check(what: str) -> Any:
    def check(module: ModuleType, original: Any) -> str | None:
        return expect_params(original, what, ("self", "request", "raw_request"))

    return check


CHAT_PATCH = AttributePatch(
    NAME,
    CHAT,
    "OpenAIServingChat.create_chat_completion",
    _make,
    _check("OpenAIServingChat.create_chat_completion"),
)
COMPLETION_PATCH = AttributePatch(
    NAME,
    COMPLETION,
    "OpenAIServingCompletion.create_completion",
    _make,
    _check("OpenAIServingCompletion.create_completion"),
)
# Only where vLLM's API server is imported (``vllm serve``).
GUARD = OptionalPatch(
    NAME,
    (CHAT_PATCH, COMPLETION_PATCH),
    "guided_* request fields are ignored with only a warning (served unconstrained)",
    only_where=API_SERVER,
)
install, installed, uninstall, RUNTIME_PATCHES = GUARD.bindings()
