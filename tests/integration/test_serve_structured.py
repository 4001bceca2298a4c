"""Structured output, tool calling and the Qwen3 reasoning parser through ``vllm serve``
in host emulation, as docs/structured-output.md tells an operator to run them.

One server for the module (a start costs 40+ s here): the tiny Qwen3 with the byte-level
BPE tokenizer (``vllm-kunlun tiny-model --tokenizer bpe``: it spells any JSON and has
control-character tokens), vLLM from a copy of the installed tree with the patch set
applied by ``vllm-kunlun patch apply --root`` (so the grammar bitmask is applied by patch
07's torch ops, the Kunlun path), ``--enable-auto-tool-choice --tool-call-parser hermes
--reasoning-parser qwen3``, prefix caching on (vLLM's default).

Every constrained answer is sampled at temperature 1, many per request (``n``), and
judged by an implementation nobody here wrote: ``json.loads`` (strict: raw control
characters are errors), ``jsonschema``, ``re.fullmatch``; bad schemas, regexes and
grammars are 400s naming the problem with the engine still serving.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from tests.conftest import child_env
from tests.integration.serve_clients import NAME, TIMEOUT, engine_core_alive
from tests.integration.vllm_tree import copy_tree
from vllm_kunlun.demo.server_process import ServerProcess, start_server

pytestmark = pytest.mark.slow

N = 16  # answers per request, all sampled at temperature 1
SERVE_ARGS = [
    "--served-model-name",
    NAME,
    "--max-model-len",
    "1024",
    "--max-num-seqs",
    "32",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
    "--reasoning-parser",
    "qwen3",
    "--structured-outputs-config",
    '{"backend": "xgrammar", "enable_in_reasoning": true, '
    '"disable_any_whitespace": true}',
]

SHORT_STRING = {
    "type": "object",
    "properties": {"key": {"type": "string", "maxLength": 8}},
    "required": ["key"],
}
RECORD = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {
            "type": "array",
            "items": {"type": "string", "enum": ["red", "green", "blue"]},
            "maxItems": 3,
        },
        "ok": {"type": "boolean"},
        "code": {"type": "string", "pattern": "^[A-Z]{2}.[0-9]$"},
    },
    "required": ["name", "age", "tags", "ok", "code"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
        },
    },
}


def cli(*argv: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_kunlun.cli", *argv],
        env=child_env(fakes=False),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("structured") / "tiny-qwen3-bpe")
    cli("tiny-model", out, "--tokenizer", "bpe")
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the installed vLLM with the patch set applied the documented way."""
    root = copy_tree(tmp_path_factory.mktemp("site"), full=True)
    cli("patch", "apply", "--root", str(root))
    assert "patch_torch251: 7/7 applied" in cli("patch", "status", "--root", str(root))
    return root


@pytest.fixture(scope="module")
def server(
    model_dir: str, site: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    env = child_env({"VLLM_KUNLUN_HOST_EMULATION": "1", "VLLM_LOGGING_LEVEL": "INFO"})
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    srv = start_server(
        model_dir, SERVE_ARGS, env, log_dir=tmp_path_factory.mktemp("log")
    )
    try:
        yield srv
    finally:
        srv.stop(timeout=10)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
    )


def complete(client: openai.OpenAI, so: dict, max_tokens: int = 96) -> list[Any]:
    answer = client.completions.create(
        model=NAME,
        prompt="the answer is ",
        n=N,
        temperature=1.0,
        max_tokens=max_tokens,
        extra_body={"structured_outputs": so},
    )
    return list(answer.choices)


def chat(client: openai.OpenAI, max_tokens: int = 96, **fields: Any) -> list[Any]:
    answer = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "what is the weather in paris ?"}],
        n=N,
        temperature=1.0,
        max_tokens=max_tokens,
        **fields,
    )
    return list(answer.choices)


def post(server: ServerProcess, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{server.url}/v1/completions",
        data=json.dumps(
            {"model": NAME, "prompt": "x", "max_tokens": 16, **body}
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def valid(text: str, schema: dict) -> Any:
    """``text`` parsed strictly and validated; the one tolerated failure is xgrammar
    0.1.29's lenient UTF-8 inside a string (docs/structured-output.md, "Known
    limits"): an overlong or surrogate byte sequence passes as one character and
    reaches the answer as U+FFFD pairs, over a maxLength or outside a pattern."""
    try:
        value = json.loads(text)  # strict: a raw control character is an error
    except ValueError as exc:
        raise AssertionError(f"{exc}: {text!r}") from None
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        lenient_utf8 = exc.validator in ("maxLength", "pattern") and "\ufffd" in str(
            exc.instance
        )
        if not lenient_utf8:
            raise AssertionError(f"{exc.message}: {text!r}") from None
    return value


@pytest.mark.parametrize("schema", [SHORT_STRING, RECORD], ids=["short", "record"])
def test_json_schema_answers_parse_and_validate(
    client: openai.OpenAI, schema: dict
) -> None:
    choices = chat(
        client,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema},
        },
    )
    for choice in choices:
        assert choice.finish_reason == "stop", choice
        valid(choice.message.content, schema)


def test_no_raw_control_character_in_strings(
    client: openai.OpenAI, model_dir: str
) -> None:
    """The issue's schema over a vocabulary with control-character tokens: 64 answers,
    every one strict JSON (without ``strict_json_strings`` about a quarter are not)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab = tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))
    controls = [t for t in vocab if len(t) == 1 and ord(t) in range(0x100, 0x121)]
    assert len(controls) >= 30  # byte-level symbols of bytes 0x00-0x20
    texts = []
    for _ in range(4):
        for choice in complete(client, {"json": SHORT_STRING}):
            assert choice.finish_reason == "stop"
            valid(choice.text, SHORT_STRING)
            texts.append(choice.text)
    assert len(set(texts)) > len(texts) // 4  # sampled, not one greedy answer


def test_json_object_answers_are_objects(client: openai.OpenAI) -> None:
    """Through the completions API: in a chat, ``--reasoning-parser qwen3`` splits an
    answer whose JSON strings hold both ``<think>`` and ``</think>`` (any unbounded
    string may; docs/structured-output.md, "Known limits")."""
    choices = complete(client, {"json_object": True}, max_tokens=256)
    stopped = [c for c in choices if c.finish_reason == "stop"]
    assert len(stopped) >= N // 4, [c.finish_reason for c in choices]
    for choice in stopped:
        assert isinstance(valid(choice.text, {"type": "object"}), dict)


@pytest.mark.parametrize(
    "regex",
    [r"[a-z]{2,6}-[0-9]{1,3}", r"(yes|no), because [a-z ]{3,12}\."],
)
def test_regex_answers_match(client: openai.OpenAI, regex: str) -> None:
    for choice in complete(client, {"regex": regex}):
        assert choice.finish_reason == "stop"
        assert re.fullmatch(regex, choice.text), choice.text


def test_choice_answers_are_choices(client: openai.OpenAI) -> None:
    options = ["red", "green", "blue", "a long answer"]
    for choice in complete(client, {"choice": options}):
        assert choice.text in options


def test_grammar_answers_are_in_the_language(client: openai.OpenAI) -> None:
    grammar = 'root ::= "(" num (" + " num)* ")"\nnum ::= [1-9] [0-9]{0,3}'
    for choice in complete(client, {"grammar": grammar}, max_tokens=256):
        if choice.finish_reason == "stop":
            assert re.fullmatch(r"\([1-9]\d{0,3}( \+ [1-9]\d{0,3})*\)", choice.text)


@pytest.mark.parametrize(
    ("so", "words"),
    [
        ({"json": {"type": "nonsense"}}, ["nonsense"]),
        ({"json": {"properties": {"a": {"$ref": "#/nowhere"}}}}, ["nowhere"]),
        ({"regex": "(unclosed"}, ["regex", "parenthesis"]),
        ({"choice": []}, ["empty"]),
        ({"grammar": "root ::= undefined_rule"}, ["undefined_rule"]),
        ({"grammar": 'root ::= "a" (b'}, ["grammar"]),
    ],
)
def test_bad_constraints_are_400s_naming_the_problem(
    server: ServerProcess, so: dict, words: list[str]
) -> None:
    status, answer = post(server, {"structured_outputs": so})
    assert status == 400, answer
    for word in words:
        assert word in answer["error"]["message"], answer
    assert engine_core_alive(server)
    status, answer = post(server, {})
    assert status == 200, answer


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("guided_json", {"type": "object"}),
        ("guided_regex", "[a-z]+"),
        ("guided_choice", ["red", "blue"]),
        ("guided_grammar", 'root ::= "a"'),
    ],
)
def test_removed_guided_fields_are_400s_naming_the_replacement(
    server: ServerProcess, field: str, value: Any
) -> None:
    """vLLM 0.15.1 would serve these unconstrained with only a log warning."""
    status, answer = post(server, {field: value})
    assert status == 400, answer
    message = answer["error"]["message"]
    assert f"'{field}'" in message and '"structured_outputs"' in message, answer
    assert answer["error"]["param"] == field, answer
    status, answer = post(server, {})
    assert status == 200, answer


def test_guided_json_in_a_chat_is_a_400_naming_response_format(
    client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, extra_body={"guided_json": SHORT_STRING})
    message = str(refused.value)
    assert "'guided_json'" in message and '"response_format"' in message, message


@pytest.mark.parametrize("regex", [r"(a+)+$", r"(a|aa)*b", r"(\w{1,40}){1,40}y"])
def test_backtracking_regexes_are_bounded(server: ServerProcess, regex: str) -> None:
    """xgrammar builds an automaton (no backtracking): a classic catastrophic regex
    compiles and samples in seconds, its answer matches or ran to max_tokens."""
    start = time.monotonic()
    status, answer = post(server, {"structured_outputs": {"regex": regex}})
    assert status == 200, answer
    assert time.monotonic() - start < 60
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length" or re.fullmatch(regex, choice["text"])


def check_named_tool_choice(client: openai.OpenAI) -> None:
    choices = chat(
        client,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    for choice in choices:
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather"
        valid(call.function.arguments, WEATHER["function"]["parameters"])


def check_auto_tool_choice(client: openai.OpenAI) -> None:
    """The model's text holds a Qwen3 / Hermes ``<tool_call>`` block (forced by a
    regex: the tiny model would not write one); vLLM's parser returns it as a call."""
    regex = (
        r'<tool_call>\n\{"name": "get_weather", "arguments": '
        r'\{"city": "[a-z]{1,8}", "days": [1-7]\}\}\n</tool_call>'
    )
    choices = chat(
        client,
        max_tokens=128,
        tools=[WEATHER],
        tool_choice="auto",
        extra_body={"structured_outputs": {"regex": regex}},
    )
    for choice in choices:
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather"
        valid(call.function.arguments, WEATHER["function"]["parameters"])
        assert not (choice.message.content or "").strip()


def check_reasoning_split(client: openai.OpenAI) -> None:
    regex = r"<think>[a-z ]{1,20}</think>[a-z]{1,20}"
    choices = chat(client, extra_body={"structured_outputs": {"regex": regex}})
    for choice in choices:
        message = choice.message
        reasoning = getattr(message, "reasoning_content", None) or getattr(
            message, "reasoning", None
        )
        assert re.fullmatch(r"[a-z ]{1,20}", reasoning or ""), message
        assert re.fullmatch(r"[a-z]{1,20}", message.content or ""), message


def test_named_tool_choice_arguments_are_valid_json(client: openai.OpenAI) -> None:
    check_named_tool_choice(client)


def test_auto_tool_choice_is_parsed_by_the_hermes_parser(
    client: openai.OpenAI,
) -> None:
    check_auto_tool_choice(client)


def test_reasoning_parser_splits_reasoning_from_content(
    client: openai.OpenAI,
) -> None:
    check_reasoning_split(client)


def test_structured_output_with_prefix_caching(
    server: ServerProcess, client: openai.OpenAI
) -> None:
    """The same long prompt twice: the second reuses the first one's cached blocks
    (vLLM's own counter says so) and its constrained answers still validate."""
    prompt = "the weather in paris today is sunny and warm. " * 12

    def hits() -> float:
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as resp:
            text = resp.read().decode()
        found = re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$", text, re.M)
        return sum(float(x) for x in found)

    before = hits()
    for _ in range(2):
        answer = client.completions.create(
            model=NAME,
            prompt=prompt,
            n=4,
            temperature=1.0,
            max_tokens=64,
            extra_body={"structured_outputs": {"json": RECORD}},
        )
        for choice in answer.choices:
            valid(choice.text, RECORD)
    assert hits() > before


def causal_mtp_checkpoint(out: Path) -> str:
    """The tiny Qwen3.5 hybrid with the byte-level BPE tokenizer and an MTP head, in
    the causal text layout (``Qwen3_5ForCausalLM``: ``model.*``, ``lm_head.*``,
    ``mtp.*``, the text config at the top): written by the composite MTP spec
    (untrained head: drafts are proposed, whether accepted does not matter here), the
    vision tower dropped and the text layers renamed as a causal checkpoint names them."""
    from safetensors.torch import load_file, save_file

    from vllm_kunlun.demo.tiny_bpe import BpeTokenizerSpec
    from vllm_kunlun.demo.tiny_model import write_tiny_model
    from vllm_kunlun.demo.tiny_qwen3_5_mtp import TEXT_PREFIX, TinyQwen3_5MtpSpec

    spec = BpeTokenizerSpec(TinyQwen3_5MtpSpec(train_steps=0))
    composite = write_tiny_model(out.with_name(out.name + "-composite"), spec)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(composite / name, out / name)
    text = json.loads((composite / "config.json").read_text())["text_config"]
    (out / "config.json").write_text(
        json.dumps({**text, "architectures": ["Qwen3_5ForCausalLM"]})
    )
    tensors = load_file(str(composite / "model.safetensors"))
    save_file(
        {
            key.replace(TEXT_PREFIX, "model.", 1): value
            for key, value in tensors.items()
            if not key.startswith("model.visual.")
        },
        str(out / "model.safetensors"),
    )
    assert any(key.startswith("mtp.") for key in tensors)
    return str(out)


# vLLM 0.15.1 refuses prefix caching with speculative decoding on hybrids.
HYBRID_ARGS = [
    *SERVE_ARGS,
    "--speculative-config",
    '{"method": "mtp", "num_speculative_tokens": 2}',
    "--no-enable-prefix-caching",
]


@pytest.fixture(scope="module")
def hybrid_server(
    site: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """The tiny Qwen3.5 hybrid (Gated DeltaNet + attention) with the same tokenizer,
    served the same way plus MTP speculation (2 speculative tokens): structured
    output, tools and reasoning on the hybrid, with drafts proposed."""
    out = causal_mtp_checkpoint(tmp_path_factory.mktemp("hybrid") / "tiny-qwen3_5-bpe")
    env = child_env({"VLLM_KUNLUN_HOST_EMULATION": "1", "VLLM_LOGGING_LEVEL": "INFO"})
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    srv = start_server(out, HYBRID_ARGS, env, log_dir=tmp_path_factory.mktemp("hlog"))
    try:
        yield srv
    finally:
        srv.stop(timeout=10)


@pytest.fixture(scope="module")
def hybrid_client(hybrid_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{hybrid_server.url}/v1",
        api_key="unused",
        timeout=TIMEOUT,
        max_retries=0,
    )


def spec_counter(server: ServerProcess, name: str) -> float:
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    found = re.findall(rf"^vllm:{name}(?:_total)?\{{[^}}]*\}} (\S+)$", text, re.M)
    return sum(float(x) for x in found)


def test_hybrid_with_mtp_constrained_answers_validate_and_drafts_are_proposed(
    hybrid_server: ServerProcess, hybrid_client: openai.OpenAI
) -> None:
    before = spec_counter(hybrid_server, "spec_decode_num_drafts")
    for schema in (RECORD, SHORT_STRING):
        choices = chat(
            hybrid_client,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema},
            },
        )
        for choice in choices:
            assert choice.finish_reason == "stop", choice
            valid(choice.message.content, schema)
    for choice in complete(hybrid_client, {"json": RECORD}):
        assert choice.finish_reason == "stop"
        valid(choice.text, RECORD)
    regex = r"[a-z]{2,6}-[0-9]{1,3}"
    for choice in complete(hybrid_client, {"regex": regex}):
        assert re.fullmatch(regex, choice.text), choice.text
    # The MTP head proposed drafts for these constrained requests (vLLM's counter).
    assert spec_counter(hybrid_server, "spec_decode_num_drafts") > before


def test_hybrid_named_tool_choice_arguments_are_valid_json(
    hybrid_client: openai.OpenAI,
) -> None:
    check_named_tool_choice(hybrid_client)


def test_hybrid_auto_tool_choice_is_parsed_by_the_hermes_parser(
    hybrid_client: openai.OpenAI,
) -> None:
    check_auto_tool_choice(hybrid_client)


def test_hybrid_reasoning_parser_splits_reasoning_from_content(
    hybrid_client: openai.OpenAI,
) -> None:
    check_reasoning_split(hybrid_client)


MAX_MODEL_LEN = 1024  # SERVE_ARGS


def post_json(
    server: ServerProcess, path: str, body: dict[str, Any]
) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{server.url}{path}",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_hybrid_with_mtp_serves_prompts_up_to_the_context_length(
    hybrid_server: ServerProcess,
) -> None:
    """A prompt of max_model_len - k tokens with max_tokens k fits under MTP (vLLM
    caps the drafts' lookahead at max_model_len): every token asked for comes back.
    One more is a 400 naming the prompt length, max_tokens and max_model_len, not
    vLLM 0.15.1's "maximum context length is <max_model_len - max_tokens>" (which,
    with max_tokens = num_speculative_tokens, read as drafts counted against the
    prompt); /v1/completions' default max_tokens (16) is named when it is the cause."""
    for k in (1, 2, 3):
        prompt = [11] * (MAX_MODEL_LEN - k)
        body = {"model": NAME, "prompt": prompt, "temperature": 0, "ignore_eos": True}
        status, answer = post_json(
            hybrid_server, "/v1/completions", {**body, "max_tokens": k}
        )
        assert status == 200, answer
        assert answer["usage"]["completion_tokens"] == k
        assert answer["choices"][0]["finish_reason"] == "length"
        status, answer = post_json(
            hybrid_server, "/v1/completions", {**body, "max_tokens": k + 1}
        )
        assert status == 400, answer
        error = answer["error"]
        assert error["param"] == "max_tokens", error
        message = error["message"]
        assert f"{MAX_MODEL_LEN - k} tokens" in message, message
        assert f"max_tokens is {k + 1}" in message, message
        assert f"{MAX_MODEL_LEN} tokens" in message, message
        assert f"at most {k}" in message, message
        assert f"is {MAX_MODEL_LEN - k - 1} tokens" not in message, message
    # No max_tokens: /v1/completions asks for 16 (the OpenAI API's default).
    status, answer = post_json(
        hybrid_server, "/v1/completions", {"model": NAME, "prompt": [11] * 1020}
    )
    assert status == 400, answer
    message = answer["error"]["message"]
    assert "1020 tokens" in message and "defaults to 16" in message, message
    assert f"{MAX_MODEL_LEN} tokens" in message, message
    # max_tokens null (as many as fit) and a prompt that fills the context.
    status, answer = post_json(
        hybrid_server,
        "/v1/completions",
        {"model": NAME, "prompt": [11] * MAX_MODEL_LEN, "max_tokens": None},
    )
    assert status == 400 and answer["error"]["param"] == "max_tokens", answer
    message = answer["error"]["message"]
    assert f"{MAX_MODEL_LEN} tokens and max_tokens is null" in message, message
    assert "no room for one output token" in message, message
    # A prompt longer than the context alone keeps vLLM's message.
    status, answer = post_json(
        hybrid_server,
        "/v1/completions",
        {"model": NAME, "prompt": [11] * (MAX_MODEL_LEN + 1), "max_tokens": 1},
    )
    assert status == 400 and answer["error"]["param"] == "input_tokens", answer
    assert f"{MAX_MODEL_LEN + 1} input tokens" in answer["error"]["message"]
    # The chat route without max_tokens generates up to the context length.
    status, answer = post_json(
        hybrid_server,
        "/v1/chat/completions",
        {
            "model": NAME,
            "messages": [{"role": "user", "content": "a " * 900}],
            "temperature": 0,
            "ignore_eos": True,
        },
    )
    assert status == 200, answer
    usage = answer["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == MAX_MODEL_LEN, usage
    assert hybrid_server.proc.poll() is None and engine_core_alive(hybrid_server)
