"""The ``completion_context_length`` guard (vllm_kunlun/guards/completion_context.py)
on vLLM's own request model: which rendered prompts it refuses and what it says; the
server test (tests/integration/test_serve_structured.py) checks the boundary under MTP
end to end."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from vllm.entrypoints.openai.completion.protocol import CompletionRequest

from vllm_kunlun.guards import completion_context
from vllm_kunlun.guards.completion_context import context_problem, prompt_length


@pytest.mark.parametrize(("length", "max_tokens"), [(63, 1), (60, 4), (1, 63), (0, 64)])
def test_prompts_that_fit_pass(length: int, max_tokens: int) -> None:
    assert context_problem([length], max_tokens, False, 64) is None


@pytest.mark.parametrize(("length", "max_tokens"), [(63, 2), (60, 5), (1, 64)])
def test_a_prompt_that_does_not_fit_is_named_with_its_numbers(
    length: int, max_tokens: int
) -> None:
    message = context_problem([length], max_tokens, False, 64)
    assert message is not None
    assert message.startswith(f"The prompt has {length} tokens")
    assert f"max_tokens is {max_tokens}:" in message
    assert "maximum context length of 64 tokens" in message
    assert f"at most {64 - length}" in message
    assert "defaults" not in message


def test_the_default_max_tokens_is_named_when_it_is_the_cause() -> None:
    message = context_problem([60], 16, True, 64)
    assert message is not None and "not set: /v1/completions defaults to 16" in message


def test_a_full_prompt_is_told_to_shrink_and_the_longest_of_several_is_named() -> None:
    message = context_problem([10, 64, 5], 1, False, 64)
    assert message is not None
    assert message.startswith("Prompt 2 of 3 has 64 tokens")
    assert "send a shorter prompt" in message and "at most" not in message


def test_prompt_length_reads_token_ids_and_embeddings() -> None:
    assert prompt_length({"prompt_token_ids": [1, 2, 3]}) == 3
    assert prompt_length({"prompt_embeds": torch.zeros(5, 8)}) == 5
    assert prompt_length("not a prompt") is None


class _Handler:
    """What the wrapper uses of ``OpenAIServingCompletion``, recording the requests
    vLLM's renderer saw; it renders each prompt as its token ids."""

    max_model_len = 64

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.errors: list[tuple[str, str | None]] = []

    async def render(self, request: CompletionRequest) -> Any:
        self.seen.append(request)
        prompts = request.prompt
        if prompts and isinstance(prompts[0], int):
            prompts = [prompts]
        return [{"prompt_token_ids": ids} for ids in prompts]

    def create_error_response(self, message: str, param: str | None = None) -> str:
        self.errors.append((message, param))
        return "error"


def run(handler: _Handler, **fields: Any) -> Any:
    wrapped = completion_context._make(_Handler.render)
    return asyncio.run(wrapped(handler, CompletionRequest(model="m", **fields)))


def test_the_wrapper_renders_without_max_tokens_then_checks_the_sum() -> None:
    handler = _Handler()
    assert run(handler, prompt=[7] * 62, max_tokens=2) == [
        {"prompt_token_ids": [7] * 62}
    ]
    assert handler.seen[0].max_tokens is None  # vLLM checked the prompt alone
    assert run(handler, prompt=[7] * 62, max_tokens=3) == "error"
    assert run(handler, prompt=[[7] * 10, [7] * 60]) == "error"  # default 16
    assert [param for _, param in handler.errors] == ["max_tokens", "max_tokens"]
    assert "defaults to 16" in handler.errors[1][0]
    assert "Prompt 2 of 2 has 60 tokens" in handler.errors[1][0]


def test_null_max_tokens_needs_room_for_one_token() -> None:
    handler = _Handler()
    assert run(handler, prompt=[7] * 63, max_tokens=None) == [
        {"prompt_token_ids": [7] * 63}
    ]
    assert run(handler, prompt=[7] * 64, max_tokens=None) == "error"
    message, param = handler.errors[0]
    assert param == "max_tokens"
    assert message.startswith("The prompt has 64 tokens and max_tokens is null")
    assert "no room for one output token" in message and "64 tokens" in message


@pytest.mark.parametrize("max_tokens", [65, -1])
def test_requests_outside_the_range_keep_vllms_path(max_tokens: int) -> None:
    handler = _Handler()
    request = CompletionRequest.model_construct(
        model="m", prompt=[7] * 70, max_tokens=max_tokens
    )
    wrapped = completion_context._make(_Handler.render)
    assert asyncio.run(wrapped(handler, request)) == [{"prompt_token_ids": [7] * 70}]
    assert handler.seen == [request] and not handler.errors


def test_the_patch_target_matches_the_installed_vllm() -> None:
    for patch in completion_context.GUARD.patches:
        assert patch.mismatch() is None, patch.target
