"""LoRA on the plugin's own Qwen3.5 hybrid (Gated DeltaNet + gated full attention)
through vLLM's engine in host emulation, one engine (TP 1, the vendor bgmv kernels,
faked): a mixed batch of two hand-written adapters (every ``--max-loras`` slot in use)
and the base model, the adapters on the attention and MLP projections and on the GDN
projections vLLM 0.15.1's LoRA layers cover (``in_proj_qkv``, ``in_proj_z``,
``in_proj_b`` / ``in_proj_a``, ``out_proj``). Each request's greedy tokens equal
transformers' on the base weights with that request's adapter merged
(W + alpha / r * B @ A). An adapter on the GDN ``conv1d`` (wrapped by vLLM, never run as
a linear layer) is refused at load naming it, and the engine keeps serving."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.lora_runs import run_lora
from vllm_kunlun.checks.lora_budget import lora_slot_bytes
from vllm_kunlun.demo.lora_adapters import ATTENTION, MLP, write_adapter
from vllm_kunlun.demo.tiny_model import vocabulary, write_tiny_model
from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec

pytestmark = pytest.mark.slow

MAX_TOKENS = 8
GDN = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
_WORDS = [w for w in vocabulary() if w.isalpha()]
PROMPTS = [
    " ".join(_WORDS[(7 * i + j) % len(_WORDS)] for j in range(5 + 2 * i))
    for i in range(3)
]
# (prompt, adapter): both adapters and the base on the same prompt, and others.
REQUESTS = [
    (PROMPTS[0], "wide"),
    (PROMPTS[0], None),
    (PROMPTS[0], "gdn"),
    (PROMPTS[1], "gdn"),
    (PROMPTS[2], "wide"),
    (PROMPTS[2], None),
]


def _conv1d_adapter(directory: Path, model: Path, rank: int) -> Path:
    """An adapter on layer 0's GDN conv1d, 2-D as vLLM's ColumnParallelLinear holds it
    ([conv_dim, K]); the rest of the files from write_adapter's layout."""
    import torch
    from safetensors.torch import save_file

    spec = TinyQwen3_5Spec()
    conv_dim = 2 * spec.linear_num_key_heads * spec.linear_key_head_dim + (
        spec.linear_num_value_heads * spec.linear_value_head_dim
    )
    write_adapter(directory, model, rank=rank, alpha=rank, targets=("in_proj_z",))
    module = "base_model.model.model.layers.0.linear_attn.conv1d"
    save_file(
        {
            f"{module}.lora_A.weight": torch.randn(rank, spec.linear_conv_kernel_dim),
            f"{module}.lora_B.weight": torch.randn(conv_dim, rank),
        },
        str(directory / "adapter_model.safetensors"),
    )
    config = json.loads((directory / "adapter_config.json").read_text())
    config["target_modules"] = ["conv1d"]
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def hybrid_lora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("lora-hybrid")
    model = write_tiny_model(tmp / "model", TinyQwen3_5Spec(layout="causal"))
    wide = write_adapter(
        tmp / "wide", model, rank=8, alpha=16, seed=1, targets=ATTENTION + MLP + GDN
    )
    gdn = write_adapter(
        tmp / "gdn",
        model,
        rank=16,
        alpha=16,
        seed=3,
        strength=2.0,
        targets=GDN,  # GDN projections only: the tokens change only if they are served
    )
    spec = {
        "model": str(model),
        "llm": {
            "dtype": "float32",
            "max_model_len": 256,
            "max_num_seqs": 8,
            "max_loras": 2,
            "max_lora_rank": 16,
            "seed": 0,
        },
        "adapters": {
            "wide": {"path": str(wide), "id": 1},
            "gdn": {"path": str(gdn), "id": 2},
        },
        "requests": [{"prompt": p, "adapter": a} for p, a in REQUESTS],
        "max_tokens": MAX_TOKENS,
        "bad": [
            {
                "name": "conv1d",
                "path": str(_conv1d_adapter(tmp / "conv1d", model, rank=8)),
                "id": 10,
            }
        ],
        "hf": True,
    }
    return {
        "run": run_lora(spec, tmp),
        "files": {"model": model, "wide": wide, "gdn": gdn},
    }


def test_each_request_of_a_mixed_batch_matches_transformers_with_its_adapter_merged(
    hybrid_lora: dict[str, Any],
) -> None:
    run = hybrid_lora["run"]
    for (prompt, adapter), got, want in zip(
        REQUESTS, run["tokens"], run["hf"], strict=True
    ):
        assert len(got) == MAX_TOKENS
        assert got == want, (prompt, adapter)


def test_the_adapters_change_the_tokens(hybrid_lora: dict[str, Any]) -> None:
    # One prompt under "wide", the base and "gdn": three continuations, so the
    # comparison above would fail if an adapter were ignored or swapped.
    tokens = hybrid_lora["run"]["tokens"]
    assert len({tuple(tokens[0]), tuple(tokens[1]), tuple(tokens[2])}) == 3


def test_the_adapters_cover_the_gdn_projections(hybrid_lora: dict[str, Any]) -> None:
    from safetensors.torch import load_file

    names = load_file(str(hybrid_lora["files"]["gdn"] / "adapter_model.safetensors"))
    leaves = {key.split(".")[-3] for key in names}
    assert set(GDN) <= leaves, leaves


def test_an_adapter_on_the_gdn_conv1d_is_refused_naming_it(
    hybrid_lora: dict[str, Any],
) -> None:
    error = hybrid_lora["run"]["bad"]["conv1d"]
    assert error is not None
    assert "targets conv1d" in error and "Qwen3_5ForCausalLM" in error, error
    assert "without conv1d in target_modules" in error, error


def test_the_engine_keeps_serving_after_the_refusal(
    hybrid_lora: dict[str, Any],
) -> None:
    run = hybrid_lora["run"]
    assert run["again"] == run["tokens"]


def test_the_vendor_bgmv_kernels_served_the_adapters(
    hybrid_lora: dict[str, Any],
) -> None:
    served = hybrid_lora["run"]["served"]
    assert [entry["path"] for entry in served] == ["vendor"], served
    assert served[0]["calls"] > 0


def test_the_budget_counts_the_hybrids_lora_slots(hybrid_lora: dict[str, Any]) -> None:
    # Per layer type (GDN projections, conv1d, the gated q_proj), against the bytes
    # vLLM allocated.
    config = json.loads((hybrid_lora["files"]["model"] / "config.json").read_text())
    estimate = lora_slot_bytes(config, max_loras=2, max_rank=16, tp=1, dtype_bytes=4)
    assert hybrid_lora["run"]["slot_bytes"] == [estimate]
