"""``vllm serve`` in host emulation, driven as a user drives it: the OpenAI client and
plain HTTP against a real server process on 127.0.0.1 (one server for the module), then
Ctrl-C (SIGINT) and a check that no process of its tree is left.

Tensor parallel 1: a TP 2 server starts two to three times slower here (two more
processes importing vLLM on two cores); TP 2 through the engine is tested in
test_e2e_emulation.py, and a TP 2 server was checked by hand to stop all four processes.

The reference for greedy output is transformers' greedy decoding of the same checkpoint.
Request loops are bounded (a client timeout on every call).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from transformers import AutoTokenizer

from tests.conftest import child_env
from tests.integration.e2e_runner import run_hf
from vllm_kunlun.demo.server_process import ServerProcess, start_server
from vllm_kunlun.demo.tiny_model import vocabulary, write_tiny_model

pytestmark = pytest.mark.slow

NAME = "tiny"
MAX_MODEL_LEN = 256
TIMEOUT = 120.0  # seconds, per request
PROMPTS = [
    "the quick brown fox jumps over the lazy dog",
    "one two three",
    "each layer has its own key value cache",
    "a long river runs to the sea",
]
TOKENS = 8
CHAT = [
    {"role": "system", "content": "be short"},
    {"role": "user", "content": "what is the sea ?"},
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_tiny_model(tmp_path_factory.mktemp("serve") / "tiny-qwen3"))


@pytest.fixture(scope="module")
def server(
    model_dir: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    args = [
        "--served-model-name",
        NAME,
        "--dtype",
        "float32",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-seqs",
        "64",
        "--seed",
        "0",
    ]
    env = child_env({"VLLM_KUNLUN_HOST_EMULATION": "1", "VLLM_LOGGING_LEVEL": "INFO"})
    srv = start_server(model_dir, args, env, log_dir=tmp_path_factory.mktemp("log"))
    try:
        yield srv
    finally:
        if srv.proc.poll() is None:  # the SIGINT test did not run (e.g. -k)
            srv.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
    )


@pytest.fixture(scope="module")
def tokenizer(model_dir: str) -> Any:
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def chat_prompt(tokenizer: Any) -> str:
    return tokenizer.apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True
    )


@pytest.fixture(scope="module")
def hf(model_dir: str, chat_prompt: str) -> dict[str, list[dict[str, Any]]]:
    """transformers' greedy tokens for PROMPTS and for the rendered chat."""
    jobs = [
        {
            "name": "prompts",
            "requests": [{"prompt": p, "max_tokens": TOKENS} for p in PROMPTS],
        },
        {"name": "chat", "requests": [{"prompt": chat_prompt, "max_tokens": TOKENS}]},
    ]
    return run_hf({"model": model_dir, "jobs": jobs})["jobs"]


def post(server: ServerProcess, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        server.url + path, data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return int(err.code), json.loads(err.read())


def greedy(client: openai.OpenAI, prompt: str | list[int]) -> Any:
    return client.completions.create(
        model=NAME,
        prompt=prompt,
        max_tokens=TOKENS,
        temperature=0.0,
        extra_body={"return_token_ids": True},
    )


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    (model,) = client.models.list().data
    assert model.id == NAME
    assert model.model_extra and model.model_extra["max_model_len"] == MAX_MODEL_LEN


def test_completions_match_transformers(client: openai.OpenAI, hf: dict) -> None:
    for prompt, ref in zip(PROMPTS, hf["prompts"], strict=True):
        choice = greedy(client, prompt).choices[0]
        assert choice.prompt_token_ids == ref["prompt_token_ids"]
        assert choice.token_ids == ref["token_ids"], choice.text
        assert choice.finish_reason == "length"


def test_chat_completion_uses_the_tiny_template(
    client: openai.OpenAI, hf: dict, tokenizer: Any, chat_prompt: str
) -> None:
    resp = client.chat.completions.create(
        model=NAME,
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=TOKENS,
        temperature=0.0,
        extra_body={"return_token_ids": True},
    )
    (ref,) = hf["chat"]
    assert resp.prompt_token_ids == tokenizer(chat_prompt)["input_ids"]  # type: ignore[attr-defined]
    assert resp.choices[0].token_ids == ref["token_ids"]  # type: ignore[attr-defined]
    # The text continues the prompt, hence its leading space.
    content = resp.choices[0].message.content
    assert content is not None and content.strip() == tokenizer.decode(ref["token_ids"])
    assert resp.usage is not None and resp.usage.completion_tokens == TOKENS


def test_streaming_adds_up_to_the_whole_answer(client: openai.OpenAI) -> None:
    whole = greedy(client, PROMPTS[0]).choices[0].text
    stream = client.completions.create(
        model=NAME, prompt=PROMPTS[0], max_tokens=TOKENS, temperature=0.0, stream=True
    )
    chunks = [c.choices[0] for c in stream if c.choices]
    assert len(chunks) >= 2  # really streamed
    assert "".join(c.text for c in chunks) == whole
    assert chunks[-1].finish_reason == "length"


def test_seeded_sampling_is_reproducible_across_requests(
    client: openai.OpenAI, hf: dict
) -> None:
    def sample(seed: int) -> list[int]:
        resp = client.completions.create(
            model=NAME,
            prompt=PROMPTS[1],
            max_tokens=12,
            temperature=1.0,
            seed=seed,
            extra_body={"return_token_ids": True},
        )
        return list(resp.choices[0].token_ids)  # type: ignore[attr-defined]

    first = sample(7)
    assert sample(7) == first
    assert sample(8) != first  # the seed matters: it really samples
    assert first[:TOKENS] != hf["prompts"][1]["token_ids"]  # and is not greedy


def test_64_concurrent_requests_are_all_answered(
    server: ServerProcess, hf: dict
) -> None:
    async def run() -> list[Any]:
        async with openai.AsyncOpenAI(
            base_url=f"{server.url}/v1",
            api_key="unused",
            timeout=TIMEOUT,
            max_retries=0,
        ) as aclient:
            calls = [
                aclient.completions.create(
                    model=NAME,
                    prompt=PROMPTS[i % len(PROMPTS)],
                    max_tokens=TOKENS,
                    temperature=0.0,
                    extra_body={"return_token_ids": True},
                )
                for i in range(64)
            ]
            return await asyncio.wait_for(asyncio.gather(*calls), timeout=600)

    results = asyncio.run(run())
    assert len(results) == 64
    for i, resp in enumerate(results):
        # Batched with 63 others, each answer is still the greedy reference.
        want = hf["prompts"][i % len(PROMPTS)]["token_ids"]
        assert resp.choices[0].token_ids == want, i


VOCAB = len(vocabulary())
BAD_REQUESTS = {
    "negative token id": (
        {"prompt": [-1, 5]},
        "Token id -1 at position 0 of the decoder prompt is out of vocabulary",
    ),
    "token id equal to the vocabulary size": (
        {"prompt": [5, VOCAB]},
        f"Token id {VOCAB} at position 1",
    ),
    "oversized prompt": (
        {"prompt": " ".join(["the"] * (MAX_MODEL_LEN + 10))},
        f"maximum context length is {MAX_MODEL_LEN - TOKENS} tokens",
    ),
}


@pytest.mark.parametrize("case", [*BAD_REQUESTS, "malformed JSON"])
def test_bad_request_is_a_400_and_the_server_stays_up(
    server: ServerProcess, client: openai.OpenAI, hf: dict, case: str
) -> None:
    if case == "malformed JSON":
        body, message = b'{"model": "tiny", "prompt": "the quick",', "JSON decode error"
    else:
        fields, message = BAD_REQUESTS[case]
        body = json.dumps({"model": NAME, "max_tokens": TOKENS, **fields}).encode()
    status, answer = post(server, "/v1/completions", body)
    assert status == 400, answer
    assert message in answer["error"]["message"]
    # Nothing was lost: the next request is answered as before.
    assert (
        greedy(client, PROMPTS[0]).choices[0].token_ids == hf["prompts"][0]["token_ids"]
    )
    assert server.proc.poll() is None


def test_sigint_stops_every_process_of_the_server(server: ServerProcess) -> None:
    """Last in the module: Ctrl-C, as a user stops ``vllm serve``."""
    tree = server.remember_tree()
    names = " ".join(p.name() for p in tree)
    assert len(tree) >= 2 and "EngineCore" in names, names  # server + engine core
    log = Path(server.log_path).read_text(errors="replace")
    assert "Chat template warmup completed" in log
    stopped = server.stop()
    assert stopped.leftover == [], server.log_tail()
    assert stopped.returncode == 0, server.log_tail()
    assert all(not p.is_running() for p in tree)
