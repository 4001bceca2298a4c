"""End to end in host emulation: pooling models (``LLM.embed``, ``LLM.score``) through
vLLM 0.15.1 and the plugin, embeddings equal to transformers' within ``ATOL`` (float32
throughout; the gap is summation order).

Two engines (module-scoped, engine core in the runner's interpreter, transformers'
reference after it in the same interpreter; tests/integration/pooling_runner.py):
- ``decoder``: a Qwen3-Embedding in miniature (``Qwen3ForCausalLM``, last-token pooling,
  normalized), causal attention through the portable paged backend;
- ``encoder``: a BGE-M3 in miniature (``XLMRobertaModel``, CLS pooling, normalized),
  bidirectional encoder-only attention with no KV cache
  (vllm_kunlun/ops/attention/encoder_portable.py), also scoring a query against
  documents (cosine of the embeddings).
Each embeds two batches of other sizes and prompt lengths (one prompt, then five of 3 to
40 tokens), so the padded per-request grouping of a step is exercised.
Checkpoints: tests/integration/pooling_checkpoints.py (transformers' own classes).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import child_env, run_bounded
from tests.integration.engine_specs import EMULATION
from tests.integration.pooling_checkpoints import KINDS, PAD_ID, write_embedding_model

pytestmark = pytest.mark.slow

RUNNER = Path(__file__).with_name("pooling_runner.py")
ATOL = 1e-4  # per component of unit vectors (float32 both sides)
VOCAB = 226  # the tiny vocabulary's size (ids above PAD_ID are words)
LLM_ARGS = {
    "dtype": "float32",
    "max_model_len": 128,
    "max_num_batched_tokens": 256,
    "max_num_seqs": 8,
    "seed": 0,
}


def _prompts(seed: int, lengths: list[int], cls: bool) -> list[list[int]]:
    rng = random.Random(seed)
    head = [0] if cls else []  # "<|endoftext|>" as the encoder's <s>
    return [
        head + [rng.randrange(PAD_ID + 1, VOCAB) for _ in range(n)] for n in lengths
    ]


def batches(kind: str) -> list[list[list[int]]]:
    cls = kind == "encoder"
    return [_prompts(1, [12], cls), _prompts(2, [3, 40, 17, 8, 29], cls)]


SCORE = ["the quick brown fox", ["the quick brown fox", "a lazy dog", "one two three"]]


@pytest.fixture(scope="module", params=KINDS)
def run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict:
    kind = request.param
    work = tmp_path_factory.mktemp(f"pooling-{kind}")
    spec: dict[str, Any] = {
        "model": str(write_embedding_model(work / "ckpt", kind)),
        "kind": kind,
        "llm": LLM_ARGS,
        "batches": batches(kind),
        "score": SCORE if kind == "encoder" else None,
    }
    spec_path, out_path = work / "spec.json", work / "out.json"
    spec_path.write_text(json.dumps(spec))
    proc = run_bounded(
        [sys.executable, str(RUNNER), str(spec_path), str(out_path)],
        env=child_env(EMULATION),
        timeout=600,
    )
    result = json.loads(out_path.read_text()) if out_path.exists() else {}
    if proc.returncode or result.get("error"):
        pytest.fail(
            f"{kind}: exit {proc.returncode}\n{result.get('error')}\n"
            f"--- stderr tail ---\n{proc.stderr[-4000:]}\n"
            f"--- stdout tail ---\n{proc.stdout[-3000:]}"
        )
    result["kind"] = kind
    return result


@pytest.mark.parametrize("batch", [0, 1])
def test_embeddings_match_transformers(run: dict, batch: int) -> None:
    ours, ref = run["vllm"][batch], run["hf"][batch]
    assert len(ours) == len(ref) == len(batches(run["kind"])[batch])
    for got, want in zip(ours, ref, strict=True):
        assert len(got) == len(want) == 64
        worst = max(abs(a - b) for a, b in zip(got, want, strict=True))
        assert worst < ATOL, (run["kind"], worst)
        assert abs(sum(a * a for a in got) - 1.0) < 1e-4  # normalized


def test_prompts_get_distinct_embeddings(run: dict) -> None:
    # Different prompts, different vectors: the pooling reads each request's own rows.
    vecs = run["vllm"][1]
    for i in range(len(vecs)):
        for j in range(i + 1, len(vecs)):
            assert max(abs(a - b) for a, b in zip(vecs[i], vecs[j], strict=True)) > 1e-2


def test_encoder_layers_ran_on_the_portable_backend(run: dict) -> None:
    backends = " ".join(run["serving"][0]["attention_backends"])
    assert "PortableAttentionBackend" in backends, backends


def test_score_matches_the_cosine_of_transformers_embeddings(run: dict) -> None:
    if run["kind"] != "encoder":
        pytest.skip("scored on the encoder engine")
    assert run["score"] == pytest.approx(run["hf_score"], abs=ATOL)
    assert run["score"][0] == pytest.approx(1.0, abs=ATOL)  # the query itself
    assert max(run["score"][1:]) < 0.999
