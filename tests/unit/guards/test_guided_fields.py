"""The ``guided_fields_refused`` guard (vllm_kunlun/guards/guided_fields.py) on vLLM's
own request models: which parsed requests it refuses and what it says; the server
test (tests/integration/test_serve_structured.py) checks the 400 end to end."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest

from vllm_kunlun.guards import guided_fields
from vllm_kunlun.guards.guided_fields import REPLACEMENTS, guided_field_problem

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("field", sorted(REPLACEMENTS))
def test_each_removed_field_is_named_with_its_replacement(field: str) -> None:
    request = CompletionRequest(model="m", prompt="x", **{field: "anything"})
    found = guided_field_problem(request.model_extra)
    assert found is not None
    name, message = found
    assert name == field
    assert f"'{field}'" in message and "structured_outputs" in message
    assert "unconstrained" in message


def test_guided_json_points_to_response_format_too() -> None:
    request = ChatCompletionRequest(model="m", messages=MESSAGES, guided_json={})
    found = guided_field_problem(request.model_extra)
    assert found is not None and '"response_format"' in found[1]


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"structured_outputs": {"regex": "[a-z]+"}},  # a real field: not extra
        {"guided_decoding_backend_typo": 1, "my_field": 2},
    ],
)
def test_requests_without_removed_fields_pass(extra: dict[str, Any]) -> None:
    request = CompletionRequest(model="m", prompt="x", **extra)
    assert guided_field_problem(request.model_extra) is None


class _Handler:
    """The two methods the wrapper uses, recording what it was asked."""

    def __init__(self) -> None:
        self.served: list[Any] = []
        self.errors: list[tuple[str, str | None]] = []

    async def create(self, request: Any, raw_request: Any = None) -> str:
        self.served.append(request)
        return "generated"

    def create_error_response(self, message: str, param: str | None = None) -> str:
        self.errors.append((message, param))
        return "error"


def test_the_wrapper_answers_the_error_instead_of_generating() -> None:
    handler = _Handler()
    wrapped = guided_fields._make(_Handler.create)
    bad = CompletionRequest(model="m", prompt="x", guided_regex="[a-z]+")
    good = CompletionRequest(model="m", prompt="x")
    assert asyncio.run(wrapped(handler, bad)) == "error"
    assert asyncio.run(wrapped(handler, good, None)) == "generated"
    assert handler.served == [good]
    assert [param for _, param in handler.errors] == ["guided_regex"]


def test_the_patch_targets_match_the_installed_vllm() -> None:
    for patch in guided_fields.GUARD.patches:
        assert patch.mismatch() is None, patch.target
