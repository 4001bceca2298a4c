"""The portable W8A8 kernel: exact int8 products, vLLM's quantization rules, epilogue.

Expected values are an int64 / float64 reference or worked out by hand from the rules
of vLLM's CUDA kernels (csrc/quantization/w8a8/int8/scaled_quant.cu), never taken from
the code under test.
"""

from __future__ import annotations

import pytest
import torch

from vllm_kunlun.ops.int8 import portable as p

CPU = torch.device("cpu")


def adversarial(m: int, k: int, seed: int) -> torch.Tensor:
    """Random full-range int8 rows, then the edge rows: all zero, all -128, alternating
    extremes, one outlier in a row of ones."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randint(-128, 128, (m, k), generator=gen)
    edges = [
        torch.zeros(k, dtype=torch.long),
        torch.full((k,), -128),
        torch.tensor([127, -128] * k)[:k],
        torch.ones(k, dtype=torch.long).index_fill_(0, torch.tensor([k // 2]), -128),
    ]
    for i, row in enumerate(edges[:m]):
        a[i] = row
    return a.to(torch.int8)


SHAPES = [
    (1, 1, 1),
    (3, 7, 5),  # K not a multiple of 8
    (4, 1031, 9),  # one chunk and a bit
    (17, 2 * p.CHUNK_K + 3, 16),  # several chunks, M > 16 (CUDA _int_mm's rule)
    (6, 64, 128),
]


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_int8_mm_is_bit_exact_against_int64(m: int, k: int, n: int) -> None:
    a, w = adversarial(m, k, 1), adversarial(n, k, 2)
    want = a.long() @ w.long().t()
    got = p.int8_mm(a, w)
    assert got.dtype == torch.int32
    assert torch.equal(got.long(), want)


def test_sums_past_two_to_the_24_stay_exact() -> None:
    k = 3 * p.CHUNK_K + 1
    a = torch.full((2, k), -128, dtype=torch.int8)
    w = torch.full((3, k), -128, dtype=torch.int8)
    assert p.int8_mm(a, w).unique().tolist() == [k * 128 * 128]  # 50,348,032 > 2^24


def test_every_candidate_the_probe_keeps_is_exact_and_dropped_ones_are_not() -> None:
    chosen = p.exact_int8_matmul(CPU)
    a, w = adversarial(24, 300, 3), adversarial(16, 300, 4)
    want = a.long() @ w.long().t()
    for candidate in p.CANDIDATES:
        if candidate in chosen.usable:
            assert torch.equal(candidate.mm(a, w).long(), want), candidate.name
        elif candidate.name == "torch._int_mm":
            # Dropped by the probe on this CPU: check the claim (pytorch#136746).
            assert not torch.equal(candidate.mm(a, w).long(), want)
            assert any("_int_mm is not exact" in n for n in chosen.notes)


def test_an_inexact_candidate_is_dropped_with_its_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def off_by_one(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (a.long() @ w.long().t()).int() + 1

    broken = p._Candidate("broken", off_by_one, p._always)
    monkeypatch.setattr(p, "CANDIDATES", (broken, p.CANDIDATES[1]))
    mm = p.ExactInt8Matmul(CPU)
    assert [c.name for c in mm.usable] == ["float32 K-chunks"]
    assert mm.notes[0].startswith("broken is not exact on cpu (384 of 384")

    monkeypatch.setattr(p, "CANDIDATES", (broken,))
    with pytest.raises(RuntimeError, match=r"no exact int8 matmul on cpu.*kunlun_ops"):
        p.ExactInt8Matmul(CPU)


def test_int8_mm_refuses_other_dtypes_and_shapes() -> None:
    a = torch.zeros(2, 3, dtype=torch.int8)
    with pytest.raises(TypeError, match="int8 operands"):
        p.int8_mm(a.float(), a)
    with pytest.raises(ValueError, match="K differs"):
        p.int8_mm(a, torch.zeros(2, 4, dtype=torch.int8))


# ---- activation quantization, vLLM's rules -------------------------------------------


def test_dynamic_symmetric_by_hand() -> None:
    x = torch.tensor(
        [
            [1.0, -0.5, 0.25, 0.0],  # -63.5 -> -64 (half to even), 31.75 -> 32
            [0.0, 0.0, 0.0, 0.0],  # all zero: scale 0, q 0 (vLLM: inv_s = 0)
            [1000.0, 1.0, -1.0, 3.9],  # one huge outlier: the rest rounds to 0
            [127.0, 2.5, 3.5, -126.5],  # inv_s = 1: ties go to the even neighbour
            [-5.0, 5.0, 5.0, -5.0],  # +-127 after rounding
        ]
    )
    q, scale = p.quantize_dynamic_symmetric(x)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert q.tolist() == [
        [127, -64, 32, 0],
        [0, 0, 0, 0],
        [127, 0, 0, 0],
        [127, 2, 4, -126],
        [-127, 127, 127, -127],
    ]
    assert scale.squeeze(1).tolist() == pytest.approx(
        [1 / 127, 0, 1000 / 127, 1, 5 / 127]
    )


def test_dynamic_symmetric_dequantizes_within_half_a_step() -> None:
    x = torch.randn(64, 96) * torch.logspace(-3, 3, 64).unsqueeze(1)
    q, scale = p.quantize_dynamic_symmetric(x)
    assert q.abs().max() <= 127 and (q.abs().amax(1) == 127).all()
    assert ((q.float() * scale - x).abs() <= scale / 2 * (1 + 1e-5)).all()


def test_dynamic_symmetric_takes_bf16_input() -> None:
    x = torch.tensor([[2.0, -1.0, 0.5]], dtype=torch.bfloat16)
    q, scale = p.quantize_dynamic_symmetric(x)
    assert q.tolist() == [[127, -64, 32]]  # 63.5 -> 64, 31.75 -> 32
    assert scale.dtype == torch.float32


def test_dynamic_asymmetric_by_hand() -> None:
    x = torch.tensor([[-1.0, 0.0, 2.0], [3.0, 3.0, 3.0], [0.0, 0.0, 0.0]])
    q, scale, azp = p.quantize_dynamic_asymmetric(x)
    # row 0: scale 3/255, azp = rne(-128 + 85) = -43, q = rne(x * 85) - 43
    # row 1: constant, range widened to [0, 3]: azp -128, q 127, dequantizes to 3
    # row 2: all zero: scale 1, azp -128, q -128, dequantizes to 0
    assert q.tolist() == [[-128, -43, 127], [127, 127, 127], [-128, -128, -128]]
    assert azp.dtype == torch.int32 and azp.squeeze(1).tolist() == [-43, -128, -128]
    assert scale.squeeze(1).tolist() == pytest.approx([3 / 255, 3 / 255, 1.0])
    deq = (q.int() - azp).float() * scale
    assert torch.allclose(deq, x, atol=3 / 255 / 2 + 1e-6)


def test_static_by_hand() -> None:
    x = torch.tensor([[0.5, -1.26, 300.0, -2.0]])
    s = torch.tensor(0.01)
    assert p.quantize_static(x, s).tolist() == [[50, -126, 127, -128]]
    zp = torch.tensor(10, dtype=torch.int32)
    # rne(x * 100) + 10, saturated
    assert p.quantize_static(x, s, zp).tolist() == [[60, -116, 127, -128]]


def test_compressed_tensors_divides_by_127_5_where_vllm_divides_by_127() -> None:
    """The documented rounding difference, against compressed-tensors itself."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.utils import calculate_qparams

    x = torch.tensor([[2.0, -1.0, 0.5], [-3.0, 0.0, 1.0]])
    args = QuantizationArgs(
        num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True
    )
    absmax = x.abs().amax(1, keepdim=True)
    ct_scale, _ = calculate_qparams(
        x.amin(1, keepdim=True), x.amax(1, keepdim=True), args
    )
    assert torch.allclose(ct_scale, absmax / 127.5)
    assert torch.allclose(p.quantize_dynamic_symmetric(x)[1], absmax / 127)


# ---- the whole linear against float64 --------------------------------------------------


def _reference(
    q: torch.Tensor,
    w: torch.Tensor,
    sa: torch.Tensor,
    sb: torch.Tensor,
    bias: torch.Tensor | None,
    azp: torch.Tensor | None = None,
) -> torch.Tensor:
    acc = q.double() - (0 if azp is None else azp.double().reshape(-1, 1))
    out = (
        (acc @ w.double().t()) * sa.double().reshape(-1, 1) * sb.double().reshape(1, -1)
    )
    return out if bias is None else out + bias.double()


SCHEMES = ["dynamic", "dynamic_azp", "static", "static_azp"]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_matches_float64_with_the_same_scales(
    scheme: str, with_bias: bool, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(7)
    m, k, n = 9, 1100, 24  # K crosses a chunk and is no multiple of 8
    x = (torch.randn(m, k, generator=gen) * 3).to(dtype)
    x[0] = 0  # an all-zero token
    x[1, 5] = 400.0  # an outlier
    w = adversarial(n, k, 8)
    w_scale = torch.rand(n, generator=gen) / 100 + 1e-3
    bias = torch.randn(n, generator=gen).to(dtype) if with_bias else None
    kwargs: dict = {}
    azp = None
    if scheme.startswith("static"):
        kwargs["input_scale"] = torch.tensor(0.05)
        if scheme == "static_azp":
            kwargs["input_zero_point"] = torch.tensor(7, dtype=torch.int32)
            kwargs["azp_adj"] = w.sum(1, dtype=torch.int32) * 7
            q = p.quantize_static(x, kwargs["input_scale"], kwargs["input_zero_point"])
            azp = kwargs["input_zero_point"].reshape(1)
        else:
            q = p.quantize_static(x, kwargs["input_scale"])
        sa = kwargs["input_scale"].reshape(1)
    elif scheme == "dynamic_azp":
        kwargs["azp_adj"] = w.sum(1, dtype=torch.int32)
        q, sa, azp = p.quantize_dynamic_asymmetric(x)
    else:
        q, sa = p.quantize_dynamic_symmetric(x)

    out = p.int8_linear(x.reshape(3, 3, k), w, w_scale, bias=bias, **kwargs)
    assert out.shape == (3, 3, n) and out.dtype == dtype
    want = _reference(q, w, sa, w_scale, bias, azp).reshape(3, 3, n)
    # fp32: a few float32 roundings in the epilogue; bf16: the output's own rounding
    rtol = 2e-6 if dtype == torch.float32 else 2**-8
    torch.testing.assert_close(out.double(), want, rtol=rtol, atol=1e-6)


def test_per_tensor_weight_scale_and_scalar_activation_scale() -> None:
    x = torch.randn(4, 16)
    w = adversarial(8, 16, 9)
    out = p.int8_linear(x, w, torch.tensor(0.02), input_scale=torch.tensor(0.1))
    q = p.quantize_static(x, torch.tensor(0.1))
    want = (q.double() @ w.double().t()) * 0.1 * 0.02
    torch.testing.assert_close(out.double(), want, rtol=2e-6, atol=1e-6)
