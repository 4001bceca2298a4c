"""benchmarks/int4_linear.py: its refusals, its 4-bit quantizer against the kernel it
times, and the model-memory table it prints (worked out by hand for Qwen3-32B)."""

from __future__ import annotations

import pytest
import torch

from tests.bench_module import load_benchmark


def test_unknown_shape_and_bad_tokens_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = load_benchmark("int4_linear")
    with pytest.raises(SystemExit) as info:
        bench.parse_args(["--shapes", "mlp.up_proj"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown shape(s) 'mlp.up_proj'" in err and "'32b-tp2.mlp.down_proj'" in err
    with pytest.raises(SystemExit):
        bench.parse_args(["--tokens", "0"])


def test_the_timed_int4_layer_computes_its_weight() -> None:
    """What the probe times is a real 4-bit layer: the kernel on the quantized weight
    equals a float matmul on that weight dequantized here."""
    bench = load_benchmark("int4_linear")
    w = torch.randn(32, 256, generator=torch.Generator().manual_seed(0))
    packed, scales, zeros = bench.quantize_int4(w)
    q = bench.int4.unpack_cols(packed, 4).double().reshape(32, 2, 128)
    deq = ((q - zeros.double()[..., None]) * scales.double()[..., None]).reshape(
        32, 256
    )
    assert (deq - w.double()).abs().max() < scales.max() * 0.51  # half a step
    x = torch.randn(3, 256, dtype=torch.float64)
    got = bench.int4.wna16_linear(x, packed, scales, zeros, 4, 128)
    torch.testing.assert_close(got, x @ deq.t(), rtol=1e-5, atol=1e-4)


def test_model_memory_table() -> None:
    mem = load_benchmark("int4_linear").model_memory()["Qwen3-32B"]
    params = 64 * (2 * 5120 * 8192 + 2 * 5120 * 1024 + 3 * 5120 * 25600)
    assert mem["bf16"] == 2 * params
    # 4 bits a weight + a bf16 scale and a 4-bit zero point per 128 weights
    assert mem["w4a16"] == params // 2 + params // 128 * 2 + params // 256
    assert mem["w4a16"] < mem["w8a8"] < mem["bf16"]
