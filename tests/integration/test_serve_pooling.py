"""``vllm serve`` of a pooling encoder in host emulation: the BGE-M3 in miniature
(``XLMRobertaModel``, CLS pooling, normalized; tests/integration/pooling_checkpoints.py)
behind one real server process, driven over plain HTTP:
- ``/v1/embeddings`` with token-id inputs (two prompts of other lengths) and with a text
  input: each vector equal to transformers' normalized CLS hidden state within 1e-4;
- ``/score``: a query against documents, equal to the cosine of transformers'
  embeddings of the texts as the checkpoint's tokenizer splits them.
The encoder's attention layers run the portable backend's encoder-only kernel
(vllm_kunlun/ops/attention/encoder_portable.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import child_env
from tests.integration.pooling_checkpoints import write_embedding_model
from tests.integration.pooling_runner import reference
from tests.integration.serve_clients import NAME, Client
from vllm_kunlun.demo.server_process import ServerProcess, start_server

pytestmark = pytest.mark.slow

ATOL = 1e-4
TOKEN_INPUTS = [[0, 17, 44, 91, 3, 150], [0, *range(30, 70)]]
TEXTS = ["the quick brown fox", "a lazy dog", "one two three"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    work = tmp_path_factory.mktemp("serve-pooling")
    return str(write_embedding_model(work / "ckpt", "encoder"))


@pytest.fixture(scope="module")
def server(model_dir: str) -> Iterator[ServerProcess]:
    args = [
        "--runner",
        "pooling",
        "--served-model-name",
        NAME,
        "--dtype",
        "float32",
        "--max-model-len",
        "128",
        "--max-num-seqs",
        "4",
    ]
    env = child_env({"VLLM_KUNLUN_HOST_EMULATION": "1", "VLLM_LOGGING_LEVEL": "INFO"})
    srv = start_server(model_dir, args, env, log_dir=Path(model_dir).parent)
    yield srv
    srv.stop(timeout=60)


def _post(server: ServerProcess, path: str, body: dict[str, Any]) -> Any:
    status, answer = Client(server).post(path, json.dumps(body).encode())
    assert status == 200, answer
    return answer


def _spec(model_dir: str) -> dict[str, Any]:
    return {"model": model_dir, "kind": "encoder"}


def test_embeddings_of_token_inputs_match_transformers(
    server: ServerProcess, model_dir: str
) -> None:
    answer = _post(server, "/v1/embeddings", {"model": NAME, "input": TOKEN_INPUTS})
    got = [row["embedding"] for row in sorted(answer["data"], key=lambda r: r["index"])]
    want = reference(_spec(model_dir), TOKEN_INPUTS)
    assert len(got) == len(want) == 2
    for g, w in zip(got, want, strict=True):
        assert max(abs(a - b) for a, b in zip(g, w, strict=True)) < ATOL


def test_embedding_of_a_text_matches_transformers(
    server: ServerProcess, model_dir: str
) -> None:
    from transformers import AutoTokenizer

    answer = _post(server, "/v1/embeddings", {"model": NAME, "input": TEXTS[1]})
    ids = AutoTokenizer.from_pretrained(model_dir)(TEXTS[1])["input_ids"]
    (want,) = reference(_spec(model_dir), [ids])
    got = answer["data"][0]["embedding"]
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < ATOL


def test_score_is_the_cosine_of_transformers_embeddings(
    server: ServerProcess, model_dir: str
) -> None:
    from transformers import AutoTokenizer

    answer = _post(
        server, "/score", {"model": NAME, "text_1": TEXTS[0], "text_2": TEXTS}
    )
    got = [row["score"] for row in sorted(answer["data"], key=lambda r: r["index"])]
    tok = AutoTokenizer.from_pretrained(model_dir)
    vecs = reference(_spec(model_dir), [tok(t)["input_ids"] for t in TEXTS])
    want = [sum(a * b for a, b in zip(vecs[0], v, strict=True)) for v in vecs]
    assert got == pytest.approx(want, abs=ATOL)
    assert got[0] == pytest.approx(1.0, abs=ATOL)
