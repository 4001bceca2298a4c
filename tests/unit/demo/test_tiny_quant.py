"""The W8A8 checkpoint writer: compressed-tensors' own quantizer and config parser, and
vLLM's config parser, are the judges."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vllm_kunlun.cli import main
from vllm_kunlun.demo import tiny_model, tiny_quant


@pytest.fixture(scope="module")
def w8a8_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_quant.write_tiny_w8a8(tmp_path_factory.mktemp("w8a8"))


@pytest.fixture(scope="module")
def float_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model.write_tiny_model(tmp_path_factory.mktemp("float"))


def test_layout_int8_out_in_with_channel_scales(
    w8a8_dir: Path, float_dir: Path
) -> None:
    q = load_file(str(w8a8_dir / "model.safetensors"))
    f = load_file(str(float_dir / "model.safetensors"))
    linears = tiny_quant.select(f, tiny_quant.QWEN3_LINEAR_WEIGHTS)
    assert len(linears) == 7 * 2  # q k v o gate up down, two layers
    for name in linears:
        assert q[name].dtype == torch.int8 and q[name].shape == f[name].shape
        scale = q[name.removesuffix(".weight") + ".weight_scale"]
        assert scale.dtype == torch.float32 and scale.shape == (f[name].shape[0], 1)
    untouched = set(f) - set(linears)
    assert "lm_head.weight" in untouched and "model.embed_tokens.weight" in untouched
    for name in untouched:
        assert torch.equal(q[name], f[name]), name
    assert set(q) == set(f) | {
        n.removesuffix(".weight") + ".weight_scale" for n in linears
    }


def test_weights_are_what_compressed_tensors_quantizes(float_dir: Path) -> None:
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    w = load_file(str(float_dir / "model.safetensors"))[
        "model.layers.1.mlp.down_proj.weight"
    ]
    w[3] = 0.0  # an all-zero output channel
    args = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="channel")
    scale, zp = calculate_qparams(
        w.amin(1, keepdim=True), w.amax(1, keepdim=True), args
    )
    want = quantize(w, scale, zp, args, dtype=torch.int8)
    got, got_scale = tiny_quant.quantize_weight(w)
    assert torch.equal(got_scale, scale)
    assert torch.equal(got, want)


def test_config_is_compressed_tensors_w8a8_dynamic(w8a8_dir: Path) -> None:
    from compressed_tensors.quantization import QuantizationConfig
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    raw = json.loads((w8a8_dir / "config.json").read_text())["quantization_config"]
    ct = QuantizationConfig.model_validate(raw)
    assert ct.format == "int-quantized" and ct.ignore == ["lm_head"]
    (group,) = ct.config_groups.values()
    assert group.targets == ["Linear"]
    assert (group.weights.num_bits, group.weights.strategy) == (8, "channel")
    assert group.input_activations.dynamic is True
    assert group.input_activations.strategy == "token"
    assert group.input_activations.symmetric is True

    vllm_cfg = CompressedTensorsConfig.from_config(raw)
    scheme = vllm_cfg.target_scheme_map["Linear"]
    assert vllm_cfg._is_dynamic_token_w8a8(
        scheme["weights"], scheme["input_activations"]
    )


def test_same_bytes_every_time_and_the_float_model_unchanged(
    w8a8_dir: Path, float_dir: Path, tmp_path: Path
) -> None:
    again = tiny_quant.write_tiny_w8a8(tmp_path / "again")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (again / name).read_bytes() == (w8a8_dir / name).read_bytes(), name
    # the float tiny model is not touched by the quantizer
    assert tiny_model.is_tiny_model(float_dir)
    assert not tiny_model.is_tiny_model(
        w8a8_dir
    )  # a quantized dir is not the float one
    assert json.loads((w8a8_dir / tiny_model.MARKER).read_text())["quant"] == "w8a8"


def test_refusals_name_the_cause(float_dir: Path, tmp_path: Path) -> None:
    tensors = load_file(str(float_dir / "model.safetensors"))
    with pytest.raises(ValueError, match=r"not in the checkpoint: \['nope\.weight'\]"):
        tiny_quant.quantize_tensors(tensors, ["nope.weight"])
    with pytest.raises(ValueError, match="not 2-D"):
        tiny_quant.quantize_tensors(tensors, ["model.norm.weight"])
    with pytest.raises(ValueError, match="no weights named"):
        tiny_quant.quantize_tensors(tensors, [])
    done = tiny_quant.write_tiny_w8a8(tmp_path / "q")
    with pytest.raises(ValueError, match="already quantized"):
        tiny_quant.quantize_checkpoint(done, ["lm_head.weight"], [])


def test_cli_writes_the_quantized_model(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["tiny-model", str(tmp_path / "m"), "--quant", "w8a8"]) == 0
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["quantization_config"]["format"] == "int-quantized"
    assert "W8A8" in capsys.readouterr().out


@pytest.mark.parametrize("layout", ["causal", "composite"])
def test_cli_writes_the_quantized_qwen3_5(
    tmp_path: Path, capsys: pytest.CaptureFixture, layout: str
) -> None:
    """Every text linear of the hybrid (GDN, attention, MLP) int8 with its scale, the
    vision tower and the MTP head float; the same bytes on a second write."""
    args = ["tiny-model", str(tmp_path / "m"), "--arch", "qwen3_5"]
    args += ["--layout", layout, "--quant", "w8a8"]
    assert main(args) == 0
    tensors = load_file(str(tmp_path / "m" / "model.safetensors"))
    int8 = {n for n, t in tensors.items() if t.dtype == torch.int8}
    projections = {
        n
        for n in tensors
        if ".layers." in n
        and ("_proj" in n)
        and n.endswith(".weight")
        and not n.startswith(("model.visual.", "mtp."))
    }
    assert int8 == projections
    assert {"linear_attn.in_proj_qkv", "self_attn.o_proj", "mlp.down_proj"} <= {
        ".".join(n.split(".")[-3:-1]) for n in int8
    }
    assert all(
        tensors[n.removesuffix(".weight") + ".weight_scale"].dtype == torch.float32
        for n in int8
    )
    floats = [n for n in tensors if n.startswith(("model.visual.", "mtp."))]
    assert (layout == "composite") == bool(floats)
    assert all(tensors[n].dtype != torch.int8 for n in floats)
    first = (tmp_path / "m" / "model.safetensors").read_bytes()
    assert main(args) == 0  # refreshes what it wrote
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == first
    assert "W8A8-INT8" in capsys.readouterr().out
