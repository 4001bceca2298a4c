"""``vllm serve`` in host emulation, driven as a user drives it: the OpenAI client and
plain HTTP against one real server process on 127.0.0.1 for the whole module (a server
start costs 30-60 s on the 2-core CI, so every server test shares it), in four parts:

- Serving: models, greedy completions and chat equal to transformers' greedy decoding
  of the same checkpoint, streaming, seeded sampling, 64 concurrent requests, bad
  requests answered with a 400 while the server stays up.
- Request limits: each request the adversarial run found harmful is a 400 naming the
  field and the limit, on a keep-alive connection that then serves a normal
  completion, with the engine core still alive. ``n`` is first sent one above the
  limit (``--max-num-seqs``); the billion of the original report only once that was
  refused, so a server without the guard fails instead of filling the memory.
- Accuracy: ``vllm-kunlun accuracy`` on the served checkpoint passes, top-1 agreement
  1.0 in float32 (a corrupted deployment fails in test_accuracy_broken.py).
- Last, Ctrl-C on the busy server: with 24 requests in flight (streaming and not,
  completions and chat, some clients that never read) SIGINT stops the server and
  every process it started within VLLM_KUNLUN_SHUTDOWN_TIMEOUT (its default, 10 s)
  plus slack; each client that reads gets an error naming the shutdown (a 503, or an
  error event and ``[DONE]`` on a stream) well before its own 120 s timeout, each that
  does not finds its connection closed, and the port can be bound again. Without the
  runtime patch ``serve_shutdown_bound`` (vllm_kunlun/guards/shutdown.py) the clients
  wait out their timeouts and so does the server: the test then fails at the exit
  deadline, with the server's log tail. SIGTERM, the second Ctrl-C and the deadline
  kill are tested in tests/unit/guards/test_shutdown_signals.py.

Tensor parallel 1: a TP 2 server starts two to three times slower here; TP 2 through
the engine is tested in test_e2e_emulation.py. Every request loop is bounded (a client
timeout on every call, a deadline on the stop).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest
from transformers import AutoTokenizer

from tests.conftest import child_env
from tests.docs_blocks import rehearsal_blocks
from tests.integration.e2e_runner import run_hf
from tests.integration.serve_clients import (
    NAME,
    TIMEOUT,
    Client,
    Reader,
    accuracy_cli,
    assert_refused,
    assert_still_serving,
    completion,
    drained_to_eof,
    port_free,
    requests_in_engine,
    silent_client,
)
from vllm_kunlun.demo.server_process import ServerProcess, start_server
from vllm_kunlun.demo.tiny_model import vocabulary
from vllm_kunlun.demo.tiny_quant import write_tiny_w8a8
from vllm_kunlun.envs import registry
from vllm_kunlun.guards.shutdown import SHUTDOWN_MESSAGE

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 2048  # the shutdown test's requests decode for minutes
MAX_NUM_SEQS = 32  # the limit of n; the shutdown test's 24 requests all run at once
# The server runs with the variable unset: the documented default is what is tested.
BOUND = float(registry()["VLLM_KUNLUN_SHUTDOWN_TIMEOUT"].default)
SLACK = 20.0
"""Past the bound: the interpreter's own exit after the stop (no timer can cut it
short), on two CPU cores that other test runs share."""

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


# docs/deploy.md's rehearsal, second block: this module's model, server and check.
DOCUMENTED = {s.argv[1]: s for s in rehearsal_blocks()[1]}
DOCUMENTED_DIR = "/tmp/tiny-qwen3"


def test_the_documented_rehearsal_is_this_modules_server() -> None:
    """The commands docs/deploy.md shows are the ones this module runs."""
    assert DOCUMENTED["tiny-model"].argv == [
        "vllm-kunlun",
        "tiny-model",
        DOCUMENTED_DIR,
    ]
    serve = DOCUMENTED["serve"]
    assert serve.env == {"VLLM_KUNLUN_HOST_EMULATION": "1"}
    assert serve.argv[:3] == ["vllm", "serve", DOCUMENTED_DIR]
    args = serve.argv[3:]
    for flag, value in (
        ("--served-model-name", NAME),
        ("--max-model-len", str(MAX_MODEL_LEN)),
        ("--max-num-seqs", str(MAX_NUM_SEQS)),
    ):
        assert args[args.index(flag) + 1] == value, (flag, serve.line)
    assert DOCUMENTED["accuracy"].argv == [
        "vllm-kunlun",
        "accuracy",
        "--url",
        "http://127.0.0.1:8000",
        "--model",
        DOCUMENTED_DIR,
    ]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The documented ``vllm-kunlun tiny-model`` line, run in a temporary directory."""
    out = str(tmp_path_factory.mktemp("serve") / "tiny-qwen3")
    argv = DOCUMENTED["tiny-model"].argv[1:]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_kunlun.cli",
            *(out if w == DOCUMENTED_DIR else w for w in argv),
        ],
        env=child_env(fakes=False),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def server(
    model_dir: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """The documented ``vllm serve`` line (its model moved, on a free port)."""
    serve = DOCUMENTED["serve"]
    env = child_env({**serve.env, "VLLM_LOGGING_LEVEL": "INFO"})
    srv = start_server(
        model_dir, serve.argv[3:], env, log_dir=tmp_path_factory.mktemp("log")
    )
    try:
        yield srv
    finally:
        if srv.proc.poll() is None:  # the SIGINT test did not run (e.g. -k)
            srv.stop(timeout=5)


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
        # Batched with others, each answer is still the greedy reference.
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
        f"maximum context length is {MAX_MODEL_LEN} tokens",
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


@pytest.fixture
def kept(server: ServerProcess) -> Iterator[Client]:
    c = Client(server)
    yield c
    c.conn.close()


def test_n_above_max_num_seqs_is_refused_and_a_billion_too(
    server: ServerProcess, kept: Client
) -> None:
    status, answer = kept.post("/v1/completions", completion(n=MAX_NUM_SEQS))
    assert status == 200 and len(answer["choices"]) == MAX_NUM_SEQS, answer
    status, answer = kept.post("/v1/completions", completion(n=MAX_NUM_SEQS + 1))
    assert status == 400, answer  # stop here on a server without the limit
    assert_refused(answer, "n", f"n={MAX_NUM_SEQS + 1}", f"at most {MAX_NUM_SEQS}")
    assert_refused(answer, "n", "VLLM_KUNLUN_MAX_N")
    status, answer = kept.post("/v1/completions", completion(n=1_000_000_000))
    assert status == 400, answer
    assert_refused(answer, "n", "n=1000000000", f"at most {MAX_NUM_SEQS}")
    assert_still_serving(server, kept)


BAD_NUMBERS: dict[str, tuple[dict[str, Any], str, str]] = {
    "temperature NaN": ({"temperature": math.nan}, "temperature", "not a finite"),
    "temperature inf": ({"temperature": math.inf}, "temperature", "not a finite"),
    "repetition_penalty NaN": (
        {"repetition_penalty": math.nan},
        "repetition_penalty",
        "not a finite",
    ),
    "top_k 2**64": ({"top_k": 2**64}, "top_k", "64-bit integer"),
    "priority 2**64": ({"priority": 2**64}, "priority", "64-bit integer"),
    "stop_token_ids 2**64": (
        {"stop_token_ids": [2**64]},
        "stop_token_ids",
        "64-bit integer",
    ),
}


@pytest.mark.parametrize("case", list(BAD_NUMBERS))
def test_unrepresentable_numbers_are_refused(
    server: ServerProcess, kept: Client, case: str
) -> None:
    fields, param, words = BAD_NUMBERS[case]
    status, answer = kept.post("/v1/completions", completion(**fields))
    assert status == 400, answer
    assert_refused(answer, param, words)
    assert_still_serving(server, kept)


def test_chat_completions_are_checked_too(server: ServerProcess, kept: Client) -> None:
    body = {
        "model": NAME,
        "messages": [{"role": "user", "content": "what is the sea ?"}],
        "max_tokens": 4,
        "temperature": math.nan,
    }
    status, answer = kept.post("/v1/chat/completions", json.dumps(body).encode())
    assert status == 400, answer
    assert_refused(answer, "temperature", "not a finite")
    assert_still_serving(server, kept)


@pytest.mark.parametrize(
    ("body", "kind"), [(b"[1,2,3]", "got an array"), (b"null", "got null")]
)
def test_a_body_that_is_not_an_object_is_a_400_on_a_kept_connection(
    server: ServerProcess, kept: Client, body: bytes, kind: str
) -> None:
    status, answer = kept.post("/v1/completions", body)
    assert status == 400, answer
    assert_refused(answer, "body", "must be a JSON object", kind)
    assert_still_serving(server, kept)


def test_accuracy_passes_on_the_served_checkpoint(
    server: ServerProcess, model_dir: str
) -> None:
    """``vllm-kunlun accuracy`` against transformers on the same checkpoint: float32
    emulation computes the same numbers (docs/accuracy.md). The documented line with
    this server's URL, plus ``--json``."""
    code, doc, err = accuracy_cli(server.url, model_dir)
    assert code == 0, (doc, err[-3000:])
    assert doc["passed"] and doc["failures"] == []
    assert doc["precision"] == "float32" and doc["reference_dtype"] == "float32"
    assert doc["agreement"] == 1.0
    assert doc["max_gap"] <= doc["thresholds"]["max_gap"]
    assert len(doc["prompts"]) >= 4 and all(p["positions"] > 0 for p in doc["prompts"])
    assert "Loading weights" not in err  # no progress under --json
    # Judged by what the server says it serves (runtime patch openai_served_config).
    assert doc["served_config"] == {
        "source": "/kunlun/served_config",
        "model": model_dir,
        "dtype": "float32",
        "quantization": None,
    }


def test_accuracy_fails_a_float_server_under_a_w8a8_checkpoints_name(
    server: ServerProcess, model_dir: str, tmp_path: Path
) -> None:
    """The server serves the float tiny model; --model is its W8A8 quantization. The
    thresholds used to follow the checkpoint (W8A8's loose ones) and it passed; now
    the server's own report decides, before any reference is loaded."""
    w8a8 = str(write_tiny_w8a8(tmp_path / "w8a8", float_dir=model_dir))
    code, doc, err = accuracy_cli(server.url, w8a8)
    assert code == 1, (doc, err[-3000:])
    assert doc["passed"] is False and "Traceback" not in err
    message = doc["error"]
    assert "unquantized in float32" in message and w8a8 in message, message
    assert "W8A8" in message and model_dir in message, message


def test_sigint_with_24_requests_in_flight_stops_every_process_within_the_bound(
    server: ServerProcess,
) -> None:
    """Last in the module: Ctrl-C, as a user stops ``vllm serve``."""
    tree = server.remember_tree()
    names = " ".join(p.name() for p in tree)
    assert len(tree) >= 2 and "EngineCore" in names, names  # server + engine core
    log = Path(server.log_path).read_text(errors="replace")
    assert "Chat template warmup completed" in log
    readers = [
        Reader(server.port, path, stream)
        for path in ("/v1/completions", "/v1/chat/completions")
        for stream in (True, False)
        for _ in range(6 if path == "/v1/completions" else 3)
    ]
    for r in readers:
        r.start()
    silent = [silent_client(server.port, stream=i < 4) for i in range(6)]
    total = len(readers) + len(silent)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        streams_going = all(r.first_chunk for r in readers if r.stream)
        if streams_going and requests_in_engine(server.url) >= total:
            break
        time.sleep(1)
    else:
        pytest.fail(f"{total} requests never all in flight:\n{server.log_tail()}")
    assert not any(r.ended for r in readers), readers  # none finished on its own

    sent = time.monotonic()
    server.proc.send_signal(signal.SIGINT)
    try:
        server.proc.wait(timeout=BOUND + SLACK)
    except Exception:
        pytest.fail(
            f"vllm serve still running {BOUND + SLACK:g} s after SIGINT with "
            f"{total} requests in flight; log tail:\n{server.log_tail()}"
        )
    took = time.monotonic() - sent
    print(f"vllm serve exited {took:.1f} s after SIGINT, {total} requests in flight")
    _, alive = psutil.wait_procs(tree, timeout=5)
    assert not alive, f"left running: {alive}\n{server.log_tail()}"
    assert server.proc.returncode == 0, server.log_tail()

    for r in readers:
        r.join(timeout=5)
    for r in readers:
        assert r.ended is not None and r.ended - sent < BOUND, r
        assert SHUTDOWN_MESSAGE in r.body, r  # told why, in the protocol it speaks
        if r.stream:
            assert r.status == 200 and r.body.rstrip().endswith("data: [DONE]"), r
        else:  # 503: retry elsewhere or later
            assert r.status == 503, r
    assert all(drained_to_eof(s) for s in silent)
    assert port_free(server.port)
    log = Path(server.log_path).read_text(errors="replace")
    failed = re.search(r"API server stopping: (\d+) in-flight request\(s\) failed", log)
    assert failed and int(failed.group(1)) >= total, log[-3000:]
    answered = max(r.ended or 0.0 for r in readers) - sent
    print(f"every reading client had its error {answered:.1f} s after SIGINT")
