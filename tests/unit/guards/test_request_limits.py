"""engine_request_limits and openai_json_object_body (vllm_kunlun/guards/request_limits.py)
on vLLM 0.15.1's own SamplingParams, InputProcessor.process_inputs and build_app."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.pooling_params import PoolingParams
from vllm.v1.engine.input_processor import InputProcessor

from vllm_kunlun import envs
from vllm_kunlun.guards import request_limits as rl

MAX_NUM_SEQS = 8


@pytest.fixture(autouse=True)
def _starts_without_the_guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts from vLLM's own method and leaves the state it found."""
    monkeypatch.delenv(rl.MAX_N_ENV, raising=False)
    was = rl.installed()
    rl.uninstall()
    yield
    if was:
        rl.install()


def refusal(fn: Any, *args: Any) -> VLLMValidationError:
    with pytest.raises(rl.RequestLimitError) as err:
        fn(*args)
    return err.value


# ---- n ---------------------------------------------------------------------------------


def test_n_limit_is_max_num_seqs_unless_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert rl.n_limit(MAX_NUM_SEQS) == MAX_NUM_SEQS
    monkeypatch.setenv(rl.MAX_N_ENV, "100")
    assert rl.n_limit(MAX_NUM_SEQS) == 100


@pytest.mark.parametrize("raw", ["0", "-3", "1.5", "lots", "65537"])
def test_a_malformed_limit_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(rl.MAX_N_ENV, raw)
    with pytest.raises(envs.EnvVarError, match=f"{rl.MAX_N_ENV}={raw!r} must be"):
        envs.validate_all()


def test_n_above_the_limit_is_refused_naming_n_and_the_limit() -> None:
    rl.check_n(MAX_NUM_SEQS, MAX_NUM_SEQS)
    err = refusal(rl.check_n, 1_000_000_000, MAX_NUM_SEQS)
    assert err.parameter == "n"
    assert "n=1000000000" in str(err) and f"at most {MAX_NUM_SEQS}" in str(err)
    assert rl.MAX_N_ENV in str(err)


# ---- numbers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("repetition_penalty", math.nan),
        ("repetition_penalty", math.inf),
        ("top_k", 2**64),
        ("top_k", 2**63),
        ("n", 2**64),
    ],
)
def test_vllm_accepts_what_the_guard_refuses(field: str, value: Any) -> None:
    """The upstream gaps (removal of the guard: when SamplingParams refuses these),
    then the guard naming the field."""
    params = SamplingParams(**{field: value})
    err = refusal(rl.check_sampling_values, params)
    assert err.parameter == field
    assert str(err).startswith(f"{field}={value} ")


def test_numbers_inside_lists_and_dicts_are_checked() -> None:
    err = refusal(rl.check_sampling_values, SamplingParams(stop_token_ids=[3, 2**64]))
    assert err.parameter == "stop_token_ids"
    err = refusal(rl.check_sampling_values, SamplingParams(logit_bias={5: math.nan}))
    assert err.parameter == "logit_bias"


def test_ordinary_values_and_the_int64_edges_pass() -> None:
    rl.check_sampling_values(
        SamplingParams(
            n=4,
            temperature=0.7,
            top_p=0.9,
            top_k=rl.INT64_MAX,
            seed=rl.INT64_MIN,
            stop_token_ids=[1, 2],
            logit_bias={3: -100.0},
            ignore_eos=True,
        )
    )
    rl.check_number("priority", rl.INT64_MAX)
    assert refusal(rl.check_number, "priority", rl.INT64_MIN - 1).parameter == (
        "priority"
    )


# ---- the patch on InputProcessor.process_inputs ----------------------------------------


def processor() -> Any:
    """What the wrapper reads before it hands on to vLLM's method."""
    scheduler = SimpleNamespace(max_num_seqs=MAX_NUM_SEQS)
    return SimpleNamespace(vllm_config=SimpleNamespace(scheduler_config=scheduler))


def process(params: Any, **kwargs: Any) -> list[Any]:
    """The guard around a stand-in for vLLM's method (which needs a whole engine):
    returns what reached it."""
    reached: list[Any] = []

    def original(
        self: Any,
        request_id: str,
        prompt: Any,
        params: Any,
        arrival_time: Any = None,
        lora_request: Any = None,
        tokenization_kwargs: Any = None,
        trace_headers: Any = None,
        priority: int = 0,
        data_parallel_rank: Any = None,
        resumable: bool = False,
    ) -> Any:
        reached.append((params, priority))
        return "request"

    assert rl._check_target(None, original) is None  # type: ignore[arg-type]
    guarded = rl._make_guard(original)
    assert guarded(processor(), "id", "the quick", params, **kwargs) == "request"
    return reached


def test_guard_refuses_before_vllm_sees_the_request() -> None:
    with pytest.raises(rl.RequestLimitError, match=f"at most {MAX_NUM_SEQS}"):
        process(SamplingParams(n=MAX_NUM_SEQS + 1))
    with pytest.raises(rl.RequestLimitError, match="temperature=nan"):
        process(SamplingParams(temperature=math.nan))
    with pytest.raises(rl.RequestLimitError, match="priority="):
        process(SamplingParams(), priority=2**64)
    assert process(SamplingParams(n=MAX_NUM_SEQS), priority=3) != []
    assert process(PoolingParams()) != []  # pooling: no n, nothing to sample


def test_install_wraps_vllms_own_method() -> None:
    original = InputProcessor.__dict__["process_inputs"]
    assert rl.install() is True
    assert rl.install() is False  # idempotent
    assert InputProcessor.__dict__["process_inputs"] is not original
    rl.uninstall()
    assert InputProcessor.__dict__["process_inputs"] is original


def test_a_different_upstream_signature_is_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(InputProcessor, "process_inputs", lambda self, x: None)
    assert rl.install_request_guard() is False
    assert not rl.installed()


def test_the_targets_match_vllm_0_15_1() -> None:
    from vllm.entrypoints.openai import api_server

    assert rl.PATCH.mismatch() is None
    assert rl.BODY_PATCH.mismatch() is None
    assert rl.check_build_app(api_server, api_server.build_app) is None


# ---- the body must be a JSON object ----------------------------------------------------


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b"[1,2,3]", "got an array"),
        (b"null", "got null"),
        (b'  \n "x"', "got a string"),
        (b"5", "got a number"),
        (b"true", "got a boolean"),
        (b"<html>", "it starts with '<'"),
    ],
)
def test_a_body_that_is_not_an_object_is_named(body: bytes, kind: str) -> None:
    problem = rl.body_problem(body)
    assert problem is not None and "must be a JSON object" in problem
    assert problem.endswith(kind)


@pytest.mark.parametrize("body", [b'{"prompt": "x"}', b"  {", b"", b"   "])
def test_objects_and_empty_bodies_pass(body: bytes) -> None:
    assert rl.body_problem(body) is None


async def _echo(scope: Any, receive: Any, send: Any) -> None:
    """A stand-in app that answers 200 with the whole body it received."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def call(chunks: list[bytes], content_type: bytes = b"application/json") -> Any:
    messages = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    sent: list[Any] = []

    async def receive() -> Any:
        return messages.pop(0)  # IndexError: read past the end

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "headers": [(b"content-type", content_type)],
    }
    asyncio.run(rl.JsonObjectBody(_echo)(scope, receive, send))
    assert messages == []  # the whole body was read, by the app or the middleware
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_middleware_answers_400_in_vllms_error_shape() -> None:
    status, body = call([b"[1,2,3]"])
    assert status == 400
    error = json.loads(body)["error"]
    assert error["code"] == 400 and error["type"] == "BadRequestError"
    assert error["param"] == "body" and "got an array" in error["message"]


def test_middleware_reads_the_rest_of_a_refused_body() -> None:
    """So the server can keep the connection: nothing of the request is left unread."""
    status, body = call([b" [", b"1,", b"2]"])
    assert status == 400 and b"got an array" in body


def test_middleware_hands_every_byte_on_otherwise() -> None:
    assert call([b"  ", b'{"a": ', b"1}"]) == (200, b'  {"a": 1}')
    assert call([b"[1]"], content_type=b"text/plain") == (200, b"[1]")
    assert call([b""]) == (200, b"")


def test_vllms_own_app_answers_a_non_object_body_with_400() -> None:
    """vLLM's real build_app (its SageMaker bootstrap builds the middleware stack before
    it returns): the request never reaches vLLM's validators, which raise
    AttributeError on a list; an object body still goes to vLLM's route."""
    from argparse import Namespace

    from fastapi.testclient import TestClient
    from vllm.entrypoints.openai import api_server
    from vllm.entrypoints.openai.cli_args import FrontendArgs

    # The server's own defaults (vLLM's parser needs a platform, which this process
    # lacks), plus the engine fields build_app reads.
    fields = {"model": "x", "served_model_name": None, "enable_log_requests": False}
    args = Namespace(**{"max_log_len": None, **fields, **vars(FrontendArgs())})
    rl.BODY_PATCH.apply()
    try:
        app = api_server.build_app(args)
    finally:
        rl.BODY_PATCH.revert()
    assert app.user_middleware[-1].cls is rl.JsonObjectBody
    assert app.middleware_stack is not None  # built by vLLM, then again by the patch
    client = TestClient(app, raise_server_exceptions=False)
    for body, kind in ((b"[1,2,3]", "got an array"), (b"null", "got null")):
        resp = client.post(
            "/v1/completions",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == "body"
        assert kind in resp.json()["error"]["message"]
    bad = client.post(
        "/v1/completions", content=b"[1]", headers={"content-type": "text/plain"}
    )
    assert bad.status_code != 400 or "JSON object" not in bad.text  # vLLM's own answer
