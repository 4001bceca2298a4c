"""Parsing vLLM's /v1/completions answer for ``prompt_logprobs``: the answer is built
with vLLM 0.15.1's own protocol classes and serialized as its server does."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vllm_kunlun.accuracy.endpoint import (
    EndpointError,
    ServerPosition,
    base_url,
    completion_body,
    parse_completion,
)


def vllm_answer(prompt_ids: list[int], table: list[dict[int, tuple]] | None) -> Any:
    """A CompletionResponse as vLLM's serving_completion builds it, as JSON."""
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionResponse,
        CompletionResponseChoice,
    )
    from vllm.entrypoints.openai.engine.protocol import UsageInfo
    from vllm.logprobs import Logprob

    prompt_logprobs = None
    if table is not None:
        prompt_logprobs = [None] + [
            {tid: Logprob(lp, rank, tok) for tid, (lp, rank, tok) in d.items()}
            for d in table
        ]
    resp = CompletionResponse(
        model="tiny",
        choices=[
            CompletionResponseChoice(
                index=0,
                text=" x",
                prompt_logprobs=prompt_logprobs,
                prompt_token_ids=prompt_ids,
                token_ids=[7],
            )
        ],
        usage=UsageInfo(prompt_tokens=len(prompt_ids), completion_tokens=1),
    )
    return json.loads(resp.model_dump_json())


def test_the_prompt_token_and_the_rank_1_token_are_read() -> None:
    ids = [3, 10, 11, 12]
    answer = vllm_answer(
        ids,
        [
            {10: (-0.5, 1, "a")},  # the prompt token is the argmax: one entry
            {11: (-2.0, 3, "b"), 40: (-0.25, 1, "c")},
            {12: (-9999.0, 500, "d"), 41: (-0.1, 1, "e")},  # clamped -inf
        ],
    )
    parsed = parse_completion(answer)
    assert parsed.token_ids == ids
    assert parsed.positions == [
        ServerPosition(-0.5, 1, 10, -0.5),
        ServerPosition(-2.0, 3, 40, -0.25),
        ServerPosition(-9999.0, 500, 41, -0.1),
    ]


def test_an_answer_without_prompt_logprobs_is_refused() -> None:
    with pytest.raises(EndpointError, match="no prompt_logprobs"):
        parse_completion({"choices": [{"text": "x"}]})
    answer = vllm_answer([3, 10], None)  # a server that ignored the field
    with pytest.raises(EndpointError, match="entries for 2 prompt tokens"):
        parse_completion(answer)


def test_a_table_without_the_prompt_token_is_refused() -> None:
    answer = vllm_answer([3, 10], [{40: (-0.2, 1, "c")}])
    with pytest.raises(EndpointError, match="lacks the prompt token 10"):
        parse_completion(answer)


def test_the_request_asks_for_what_is_parsed() -> None:
    body = completion_body("tiny", "one two")
    assert body["prompt_logprobs"] >= 1 and body["return_token_ids"] is True
    assert body["max_tokens"] == 1 and "echo" not in body
    # vLLM's own request model accepts it as is.
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    req = CompletionRequest(**body)
    assert req.prompt_logprobs == body["prompt_logprobs"]


def test_base_url_accepts_v1() -> None:
    assert base_url("http://h:8000/v1/") == "http://h:8000"
    assert base_url("http://h:8000") == "http://h:8000"


def test_unreachable_server_names_the_fix() -> None:
    from vllm_kunlun.accuracy.endpoint import served_models

    with pytest.raises(EndpointError, match=r"cannot reach .*fix --url"):
        served_models("http://127.0.0.1:9", timeout=5)
