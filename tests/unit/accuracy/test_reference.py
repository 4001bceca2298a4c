"""The reference's memory bound and checkpoint inspection (no weight is loaded), and
the command's refusals before any load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from vllm_kunlun.accuracy import reference
from vllm_kunlun.accuracy.cli import PROMPTS, read_prompts
from vllm_kunlun.accuracy.reference import (
    GIB,
    Checkpoint,
    ReferenceUnavailable,
    inspect_checkpoint,
    memory_estimate,
    plan_memory,
)
from vllm_kunlun.cli import main


def write_ckpt(path: Path, config: dict, tensors: dict | None = None) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        save_file(tensors, str(path / "model.safetensors"))
    return str(path)


def test_parameters_come_from_the_safetensors_headers(tmp_path: Path) -> None:
    d = write_ckpt(
        tmp_path,
        {"model_type": "qwen3", "dtype": "bfloat16", "vocab_size": 10},
        {"a": torch.zeros(3, 4, dtype=torch.bfloat16), "b": torch.zeros(5)},
    )
    ckpt = inspect_checkpoint(d)
    assert (ckpt.params, ckpt.dtype, ckpt.quant, ckpt.vocab) == (
        17,
        "bfloat16",
        "none",
        10,
    )


def test_27b_bf16_computes_in_bf16_when_float32_does_not_fit() -> None:
    ckpt = Checkpoint("d", "bfloat16", "none", 27_000_000_000, "x", 152_000)
    fp32 = memory_estimate(ckpt.params, "float32", 64, ckpt.vocab)
    bf16 = memory_estimate(ckpt.params, "bfloat16", 64, ckpt.vocab)
    assert 100 * GIB < fp32 < 104 * GIB and 50 * GIB < bf16 < 53 * GIB
    assert plan_memory(ckpt, 64, 128 * GIB).dtype == "float32"
    assert plan_memory(ckpt, 64, 64 * GIB).dtype == "bfloat16"
    with pytest.raises(ReferenceUnavailable) as exc:
        plan_memory(ckpt, 64, 32 * GIB)
    msg = str(exc.value)
    assert "about 52.4 GiB (27.00 B parameters in bfloat16" in msg
    assert "32.0 GiB RAM is available" in msg and "more free memory" in msg


def test_unsupported_checkpoints_are_refused(tmp_path: Path) -> None:
    fp8 = {"quantization_config": {"quant_method": "fp8"}, "dtype": "bfloat16"}
    with pytest.raises(ReferenceUnavailable, match="'fp8' has no reference"):
        inspect_checkpoint(write_ckpt(tmp_path / "fp8", fp8, {"a": torch.zeros(1)}))
    with pytest.raises(ReferenceUnavailable, match="not a directory"):
        inspect_checkpoint(str(tmp_path / "missing"))


def test_w8a8_needs_compressed_tensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = {
        "quant_method": "compressed-tensors",
        "config_groups": {"g": {"weights": {"num_bits": 8, "type": "int"}}},
    }
    d = write_ckpt(tmp_path, {"quantization_config": q}, {"a": torch.zeros(2)})
    assert inspect_checkpoint(d).quant == "w8a8"
    real = reference.importlib.util.find_spec
    monkeypatch.setattr(
        reference.importlib.util,
        "find_spec",
        lambda n, *a: None if n == "compressed_tensors" else real(n, *a),
    )
    with pytest.raises(ReferenceUnavailable, match="pip install compressed-tensors"):
        inspect_checkpoint(d)


def test_prompts_file_json_or_lines(tmp_path: Path) -> None:
    assert read_prompts(None) == list(PROMPTS)
    f = tmp_path / "p.json"
    f.write_text(json.dumps(["a b", "c\nd"]))
    assert read_prompts(str(f)) == ["a b", "c\nd"]
    f.write_text("one two\n\nthree four\n")
    assert read_prompts(str(f)) == ["one two", "three four"]


def test_usage_and_connection_errors_exit_2_with_only_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = write_ckpt(tmp_path / "m", {"dtype": "float32"}, {"a": torch.zeros(2)})
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert (
        main(
            [
                "accuracy",
                "--url",
                "http://127.0.0.1:9",
                "--model",
                d,
                "--prompts",
                str(bad),
            ]
        )
        == 2
    )
    assert "list of strings" in capsys.readouterr().err
    code = main(["accuracy", "--url", "http://127.0.0.1:9", "--model", d, "--json"])
    out = capsys.readouterr().out
    assert code == 2 and json.loads(out)["error"].startswith("cannot reach")


def test_a_w8a8_composite_is_refused_not_misread(tmp_path: Path) -> None:
    """transformers would load the log's format (a W8A8 Qwen3.5 composite) as a float
    model with int8 values for weights: the check refuses instead of passing or failing
    a deployment on a wrong reference."""
    from vllm_kunlun.demo.tiny_quant import write_tiny_w8a8
    from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec

    d = write_tiny_w8a8(tmp_path / "m", TinyQwen3_5Spec(layout="composite"))
    with pytest.raises(ReferenceUnavailable, match="no trustworthy reference"):
        inspect_checkpoint(str(d))
    causal = write_tiny_w8a8(tmp_path / "c", TinyQwen3_5Spec(layout="causal"))
    assert inspect_checkpoint(str(causal)).quant == "w8a8"
