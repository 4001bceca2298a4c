"""The tiny 4-bit checkpoint writers (vllm_kunlun/demo/tiny_int4.py): each format's
tensors have the shapes vLLM's own layers create for them, and dequantize (by the
references in tests/integration/int4_reference.py, or compressed-tensors' own
decompression) to within half a quantization step of the float weights (GPTQ: one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.integration.int4_reference import (
    awq_dequantize_reference,
    gptq_dequantize_reference,
)
from vllm_kunlun.demo import tiny_int4
from vllm_kunlun.demo.tiny_model import write_tiny_model

PROJ = "model.layers.1.mlp.down_proj"  # [64, 128]: in 128 = 4 groups of 32


@pytest.fixture(scope="module")
def float_weight(tmp_path_factory: pytest.TempPathFactory) -> torch.Tensor:
    d = write_tiny_model(tmp_path_factory.mktemp("float") / "m")
    return load_file(str(d / "model.safetensors"))[PROJ + ".weight"].double()


def _half_step(err: torch.Tensor, step: torch.Tensor, steps: float = 0.5) -> None:
    assert bool((err <= steps * step + 1e-6).all()), float((err - steps * step).max())


def test_awq_writer(tmp_path: Path, float_weight: torch.Tensor) -> None:
    d = tiny_int4.write_tiny_awq(tmp_path / "awq")
    t = load_file(str(d / "model.safetensors"))
    assert t[PROJ + ".qweight"].shape == (128, 8)  # [in, out / 8]
    assert t[PROJ + ".qzeros"].shape == (4, 8) and t[PROJ + ".scales"].shape == (4, 64)
    assert t[PROJ + ".scales"].dtype == torch.float16
    w = awq_dequantize_reference(t, PROJ, 32)
    step = t[PROJ + ".scales"].double().t().repeat_interleave(32, dim=1)
    _half_step((w - float_weight).abs(), step)


@pytest.mark.parametrize(
    ("bits", "desc_act", "sym"), [(4, True, False), (8, False, True)]
)
def test_gptq_writer(
    tmp_path: Path, float_weight: torch.Tensor, bits: int, desc_act: bool, sym: bool
) -> None:
    d = tiny_int4.write_tiny_gptq(tmp_path / "gptq", bits, 32, desc_act, sym)
    t = load_file(str(d / "model.safetensors"))
    f = 32 // bits
    assert t[PROJ + ".qweight"].shape == (128 // f, 64)  # [in / f, out]
    assert t[PROJ + ".qzeros"].shape == (4, 64 // f)
    g_idx = t[PROJ + ".g_idx"].long()
    assert torch.equal(torch.bincount(g_idx), torch.full((4,), 32))
    assert (g_idx != torch.arange(128) // 32).any() == desc_act
    w = gptq_dequantize_reference(t, PROJ, bits)
    step = t[PROJ + ".scales"].double()[g_idx].t()
    # GPTQ's grid: a rounded zero point (or the symmetric midpoint) can clip the
    # range's end by up to half a step more
    _half_step((w - float_weight).abs(), step, steps=1.0)


def test_w4a16_writer(tmp_path: Path, float_weight: torch.Tensor) -> None:
    d = tiny_int4.write_tiny_w4a16(tmp_path / "ct")
    t = load_file(str(d / "model.safetensors"))
    assert t[PROJ + ".weight_packed"].shape == (64, 16)  # [out, in / 8]
    assert t[PROJ + ".weight_zero_point"].shape == (8, 1)  # channel, asymmetric
    args = tiny_int4.layer_args(PROJ + ".weight", tiny_int4.w4a16_config())
    assert args is not None and args["strategy"] == "channel"
    w = tiny_int4.dequantize(t, PROJ, args).double()
    step = t[PROJ + ".weight_scale"].double().expand(64, 128)
    _half_step((w - float_weight).abs(), step)
