"""LoRA through vLLM's engine on the host-emulation platform: an engine at TP 1 (on the
vendor bgmv kernels, faked) and one at TP 2 (on the portable kernel) serve a mixed
batch of two hand-written adapters (every ``--max-loras`` slot in use) and the base
model; each request's greedy tokens equal transformers' on the base weights with that
request's adapter merged (W + alpha / r * B @ A). Bad adapters are refused at load with
an error naming the cause, and the engine keeps serving the same tokens."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.integration.lora_runs import run_lora
from vllm_kunlun.checks.lora_budget import lora_slot_bytes
from vllm_kunlun.demo.lora_adapters import write_adapter
from vllm_kunlun.demo.tiny_model import TinyQwen3Spec, vocabulary, write_tiny_model

MAX_TOKENS = 8
_WORDS = [w for w in vocabulary() if w.isalpha()]
PROMPTS = [
    " ".join(_WORDS[(5 * i + j) % len(_WORDS)] for j in range(6 + i)) for i in range(4)
]
# (prompt, adapter): both adapters and the base, twice each, in one batch.
REQUESTS = [
    (PROMPTS[0], "sql"),
    (PROMPTS[1], None),
    (PROMPTS[2], "chat"),
    (PROMPTS[0], "chat"),
    (PROMPTS[3], "sql"),
    (PROMPTS[0], None),
]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("lora-files")
    model = write_tiny_model(tmp / "model", TinyQwen3Spec())
    return {
        "model": model,
        "sql": write_adapter(tmp / "sql", model, rank=8, alpha=16, seed=1),
        "chat": write_adapter(
            tmp / "chat",
            model,
            rank=64,
            alpha=32,
            seed=2,
            targets=("q_proj", "v_proj", "down_proj"),
        ),
    }


def base_spec(files: dict[str, Path]) -> dict[str, Any]:
    return {
        "model": str(files["model"]),
        "llm": {
            "dtype": "float32",
            "max_model_len": 256,
            "max_num_seqs": 8,
            "max_loras": 2,
            "max_lora_rank": 64,
            "seed": 0,
        },
        "adapters": {
            "sql": {"path": str(files["sql"]), "id": 1},
            "chat": {"path": str(files["chat"]), "id": 2},
        },
        "requests": [{"prompt": p, "adapter": a} for p, a in REQUESTS],
        "max_tokens": MAX_TOKENS,
        "hf": True,
    }


@pytest.fixture(scope="module")
def lora_run(
    adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("lora")
    model = adapters["model"]
    bad = {
        "too_big_rank": write_adapter(tmp / "r128", model, rank=128, alpha=128, seed=3),
        "unknown_module": write_adapter(
            tmp / "unknown", model, rank=8, alpha=8, targets=("visual_proj",)
        ),
        "missing_file": tmp / "does-not-exist",
        "wrong_shape": write_adapter(
            tmp / "wide", model, rank=8, alpha=8, seed=4, in_features_delta=8
        ),
        # k_proj is a slice of vLLM's packed qkv_proj: its height is checked per slice.
        "wrong_k_height": write_adapter(
            tmp / "tall-k",
            model,
            rank=8,
            alpha=8,
            seed=5,
            targets=("k_proj",),
            out_features_delta=16,
        ),
    }
    spec = {
        **base_spec(adapters),
        "bad": [
            {"name": name, "path": str(path), "id": 10 + i}
            for i, (name, path) in enumerate(bad.items())
        ],
    }
    return run_lora(spec, tmp)


@pytest.fixture(scope="module")
def lora_tp2(
    adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The same mixed batch at tensor parallel 2 (column and row parallel LoRA)."""
    spec = base_spec(adapters)
    spec["llm"]["tensor_parallel_size"] = 2
    return run_lora(spec, tmp_path_factory.mktemp("lora-tp2"), in_process=False)


def test_each_request_of_a_mixed_batch_matches_transformers_with_its_adapter_merged(
    lora_run: dict[str, Any],
) -> None:
    for (prompt, adapter), got, want in zip(
        REQUESTS, lora_run["tokens"], lora_run["hf"], strict=True
    ):
        assert len(got) == MAX_TOKENS
        assert got == want, (prompt, adapter)


def test_the_adapters_change_the_tokens(lora_run: dict[str, Any]) -> None:
    # The same prompt under the base, "sql" and "chat": three different continuations,
    # so the comparison above could fail if an adapter were ignored or swapped.
    tokens = lora_run["tokens"]
    assert len({tuple(tokens[0]), tuple(tokens[3]), tuple(tokens[5])}) == 3


def test_bad_adapters_are_refused_at_load_naming_the_cause(
    lora_run: dict[str, Any],
) -> None:
    bad = lora_run["bad"]
    assert bad["too_big_rank"] is not None
    assert "LoRA rank 128 is greater than max_lora_rank 64" in bad["too_big_rank"]
    assert bad["unknown_module"] is not None and "visual_proj" in bad["unknown_module"]
    assert bad["missing_file"] is not None
    assert "does-not-exist" in bad["missing_file"]
    # vLLM does not check shapes; the plugin's lora_adapter_shapes patch does.
    assert bad["wrong_shape"] is not None
    assert "does not fit this model" in bad["wrong_shape"], bad["wrong_shape"]
    found = re.search(
        r"takes (\d+) inputs .* lora_A is \[8, (\d+)\]", bad["wrong_shape"]
    )
    assert found and int(found[2]) == int(found[1]) + 8, bad["wrong_shape"]
    k_height = bad["wrong_k_height"]
    assert (
        k_height is not None
        and "self_attn.k_proj takes 64 inputs and gives 64" in k_height
    )
    assert "lora_B is [80, 8]" in k_height, k_height


def test_the_engine_keeps_serving_after_the_refusals(lora_run: dict[str, Any]) -> None:
    assert lora_run["again"] == lora_run["tokens"]


def test_the_vendor_bgmv_kernels_served_the_adapters(lora_run: dict[str, Any]) -> None:
    served = lora_run["served"]
    assert [entry["path"] for entry in served] == ["vendor"], served
    assert served[0]["calls"] > 0
    assert "bgmv_shrink_cluster" in served[0]["reason"]


def test_the_portable_kernel_gives_the_vendor_paths_tokens(
    lora_run: dict[str, Any], lora_tp2: dict[str, Any]
) -> None:
    assert lora_tp2["tokens"] == lora_run["tokens"]


def test_tensor_parallel_2_matches_transformers_per_request(
    lora_tp2: dict[str, Any],
) -> None:
    assert lora_tp2["tokens"] == lora_tp2["hf"]


@pytest.mark.parametrize("tp", [1, 2])
def test_the_budget_counts_the_lora_slots_vllm_allocates(
    tp: int,
    adapters: dict[str, Path],
    lora_run: dict[str, Any],
    lora_tp2: dict[str, Any],
) -> None:
    config = json.loads((adapters["model"] / "config.json").read_text())
    estimate = lora_slot_bytes(config, max_loras=2, max_rank=64, tp=tp, dtype_bytes=4)
    allocated = (lora_run if tp == 1 else lora_tp2)["slot_bytes"]
    assert allocated == [estimate] * tp
