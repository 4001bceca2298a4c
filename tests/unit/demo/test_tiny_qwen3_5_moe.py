"""The tiny Qwen3.5-MoE checkpoint: what transformers 5.2.0 reads, in both layouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from vllm_kunlun.cli import main
from vllm_kunlun.demo import tiny_model
from vllm_kunlun.demo.tiny_quant import write_tiny_w8a8
from vllm_kunlun.demo.tiny_qwen3_5_moe import TinyQwen3_5MoeSpec


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("tiny-moe")
    return {
        layout: tiny_model.write_tiny_model(
            work / layout, TinyQwen3_5MoeSpec(layout=layout)
        )
        for layout in ("causal", "composite")
    }


def test_transformers_loads_both_layouts_completely_and_alike(
    dirs: dict[str, Path],
) -> None:
    from transformers import (
        Qwen3_5MoeForCausalLM,
        Qwen3_5MoeForConditionalGeneration,
    )

    ids = torch.tensor([[5, 9, 40, 41, 7, 120]])
    logits = {}
    for layout, cls in (
        ("causal", Qwen3_5MoeForCausalLM),
        ("composite", Qwen3_5MoeForConditionalGeneration),
    ):
        model, info = cls.from_pretrained(
            str(dirs[layout]), dtype=torch.float32, output_loading_info=True
        )
        assert not any(info.values()), (layout, info)  # no missing/unexpected keys
        with torch.no_grad():
            logits[layout] = model(ids).logits
    # The composite's vocabulary ends with four vision tokens (zero lm_head rows).
    vocab = logits["causal"].shape[-1]
    assert logits["composite"].shape[-1] == vocab + 4
    torch.testing.assert_close(logits["causal"], logits["composite"][..., :vocab])
    assert not logits["composite"][..., vocab:].any()


def test_the_router_spreads_tokens_over_every_expert(dirs: dict[str, Path]) -> None:
    """Router logits of the embedded vocabulary: clear preferences (top-2 vs third
    apart) and every expert some token's first choice."""
    with safe_open(str(dirs["causal"] / "model.safetensors"), "pt") as f:
        embed = f.get_tensor("model.embed_tokens.weight")
        gate = f.get_tensor("model.layers.0.mlp.gate.weight")
    spec = TinyQwen3_5MoeSpec()
    x = embed / embed.pow(2).mean(-1, keepdim=True).sqrt()
    logits = x @ gate.T
    assert set(logits.argmax(-1).tolist()) == set(range(spec.num_experts))
    top = logits.topk(3, dim=-1).values
    assert float((top[:, 1] - top[:, 2]).median()) > 0.1


def test_config_states_the_experts(dirs: dict[str, Path]) -> None:
    config = json.loads((dirs["composite"] / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    assert config["model_type"] == "qwen3_5_moe"
    text = config["text_config"]
    assert text["model_type"] == "qwen3_5_moe_text"
    assert (text["num_experts"], text["num_experts_per_tok"]) == (8, 2)
    assert tiny_model.default_cache_dir(TinyQwen3_5MoeSpec()).name.startswith(
        "tiny-qwen3_5_moe-causal"
    )


def test_w8a8_quantizes_the_experts_and_keeps_the_routers_float(
    tmp_path: Path,
) -> None:
    out = write_tiny_w8a8(tmp_path / "q", TinyQwen3_5MoeSpec(layout="composite"))
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        dtypes = {n: f.get_slice(n).get_dtype() for n in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    p = "model.language_model.layers.0.mlp."
    for e in range(8):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            assert dtypes[f"{p}experts.{e}.{proj}.weight"] == "I8"
            assert dtypes[f"{p}experts.{e}.{proj}.weight_scale"] == "F32"
    assert dtypes[p + "shared_expert.down_proj.weight"] == "I8"
    assert dtypes[p + "gate.weight"] == "F32"
    assert dtypes[p + "shared_expert_gate.weight"] == "F32"
    ignore = json.loads((out / "config.json").read_text())["quantization_config"][
        "ignore"
    ]
    assert "re:.*mlp.gate$" in ignore and "re:.*shared_expert_gate$" in ignore


def test_cli_writes_the_moe(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    target = tmp_path / "m"
    assert main(["tiny-model", str(target), "--arch", "qwen3_5_moe"]) == 0
    assert tiny_model.is_tiny_model(target, TinyQwen3_5MoeSpec())
    assert "Qwen3.5-MoE hybrid (Qwen3_5MoeForCausalLM)" in capsys.readouterr().out
