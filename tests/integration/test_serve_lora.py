"""``vllm serve --enable-lora`` in host emulation, driven over HTTP: one server for the
module with ``--lora-modules`` (one adapter at start, ``--max-loras 2``) and runtime
adapter updates (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``). Each served adapter's greedy
tokens equal transformers' with that adapter merged, also with the base and both
adapters in flight at once; a second adapter is loaded and unloaded through the API;
a bad adapter's load is answered with an error naming the cause while the server keeps
serving the others."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import child_env
from tests.integration.lora_runner import hf_generate
from vllm_kunlun.demo.lora_adapters import write_adapter
from vllm_kunlun.demo.server_process import ServerProcess, start_server
from vllm_kunlun.demo.tiny_model import TinyQwen3Spec, write_tiny_model

pytestmark = pytest.mark.slow

BASE = "tiny"
TOKENS = 6
PROMPTS = [[5, 17, 42, 9, 77, 31], [60, 8, 8, 101, 3, 45, 12, 90]]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("serve-lora")
    model = write_tiny_model(tmp / "model", TinyQwen3Spec())
    return {
        "model": model,
        "sql": write_adapter(tmp / "sql", model, rank=8, alpha=16, seed=11),
        "chat": write_adapter(
            tmp / "chat",
            model,
            rank=16,
            alpha=16,
            seed=12,
            targets=("o_proj", "up_proj"),
        ),
        "too_big": write_adapter(tmp / "r64", model, rank=64, alpha=64, seed=13),
        "log": tmp,
    }


@pytest.fixture(scope="module")
def server(files: dict[str, Path]) -> Iterator[ServerProcess]:
    env = child_env(
        {
            "VLLM_KUNLUN_HOST_EMULATION": "1",
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_LOGGING_LEVEL": "INFO",
        }
    )
    args = [
        "--served-model-name", BASE,
        "--dtype", "float32",
        "--max-model-len", "256",
        "--max-num-seqs", "8",
        "--enable-lora",
        "--max-loras", "2",
        "--max-lora-rank", "16",
        "--lora-modules", f"sql={files['sql']}",
    ]  # fmt: skip
    srv = start_server(str(files["model"]), args, env, log_dir=files["log"])
    try:
        yield srv
    finally:
        srv.stop(timeout=30)


def post(server: ServerProcess, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{server.url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            raw = resp.read().decode()
            status = int(resp.status)
    except urllib.error.HTTPError as err:
        raw, status = err.read().decode(), err.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def complete(server: ServerProcess, model: str, prompt: list[int]) -> list[int]:
    status, answer = post(
        server,
        "/v1/completions",
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": TOKENS,
            "temperature": 0.0,
            "return_token_ids": True,
        },
    )
    assert status == 200, answer
    return list(answer["choices"][0]["token_ids"])


def reference(files: dict[str, Path], adapter: str | None) -> list[list[int]]:
    path = None if adapter is None else str(files[adapter])
    return hf_generate(str(files["model"]), path, PROMPTS, TOKENS)


def models(server: ServerProcess) -> list[str]:
    with urllib.request.urlopen(f"{server.url}/v1/models", timeout=30) as resp:
        return [m["id"] for m in json.loads(resp.read())["data"]]


def test_the_start_adapter_is_listed_and_matches_transformers(
    server: ServerProcess, files: dict[str, Path]
) -> None:
    assert set(models(server)) == {BASE, "sql"}
    want = reference(files, "sql")
    assert [complete(server, "sql", p) for p in PROMPTS] == want
    assert want != reference(files, None)  # the adapter changes the tokens


def test_a_bad_adapter_is_refused_and_the_others_keep_serving(
    server: ServerProcess, files: dict[str, Path]
) -> None:
    status, answer = post(
        server,
        "/v1/load_lora_adapter",
        {"lora_name": "too_big", "lora_path": str(files["too_big"])},
    )
    assert status == 400, answer
    assert "LoRA rank 64 is greater than max_lora_rank 16" in json.dumps(answer)
    assert "too_big" not in models(server)
    assert [complete(server, "sql", p) for p in PROMPTS] == reference(files, "sql")


def test_a_dynamic_adapter_serves_beside_the_base_and_is_unloaded(
    server: ServerProcess, files: dict[str, Path]
) -> None:
    status, answer = post(
        server,
        "/v1/load_lora_adapter",
        {"lora_name": "chat", "lora_path": str(files["chat"])},
    )
    assert status == 200, answer
    assert set(models(server)) == {BASE, "sql", "chat"}
    # Base, sql and chat in flight at once: both adapter slots in use.
    jobs = [(m, p) for m in (BASE, "sql", "chat") for p in PROMPTS]
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda job: complete(server, *job), jobs))
    want = reference(files, None) + reference(files, "sql") + reference(files, "chat")
    assert got == want
    status, answer = post(server, "/v1/unload_lora_adapter", {"lora_name": "chat"})
    assert status == 200, answer
    assert "chat" not in models(server)
    status, answer = post(
        server,
        "/v1/completions",
        {"model": "chat", "prompt": PROMPTS[0], "max_tokens": 2},
    )
    assert status == 404, answer
