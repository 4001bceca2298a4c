"""The weight-only integer kernels (vllm_kunlun/ops/int4/): packing against vLLM's and
compressed-tensors' own unpacking, the portable kernel against compressed-tensors'
decompression in float64, the vendor path through the fake ``gptq_gemm``, and the
vLLM kernel class's refusals and kernel-list patch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from compressed_tensors.compressors import PackedQuantizationCompressor
from compressed_tensors.compressors.quantized_compressors.pack_quantized import (
    unpack_from_int32,
)
from compressed_tensors.quantization import QuantizationArgs
from compressed_tensors.quantization.utils import calculate_qparams
from vllm.model_executor.layers.quantization.awq import AWQConfig  # before the fixture
from vllm.model_executor.layers.quantization.gptq import GPTQConfig
from vllm.model_executor.layers.quantization.kernels.mixed_precision.MPLinearKernel import (
    MPLinearLayerConfig,
)
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    unpack_quantized_values_into_int32,
)
from vllm.scalar_type import scalar_types

from tests.conftest import serve_platform
from vllm_kunlun.ops.int4 import portable, seam
from vllm_kunlun.ops.int4 import wna16_kernel_table_patch as table_patch
from vllm_kunlun.ops.int4.wna16_kernel import KunlunWNA16LinearKernel
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform

_COMPRESSOR = PackedQuantizationCompressor.__new__(PackedQuantizationCompressor)


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("VLLM_KUNLUN_EMULATION_VENDOR", raising=False)
    serve_platform(monkeypatch, KunlunHostEmulationPlatform)
    seam.reset()
    yield
    seam.reset()


def quantized(
    n: int,
    k: int,
    bits: int,
    strategy: str,
    group_size: int | None,
    symmetric: bool,
    actorder: bool = False,
    seed: int = 0,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """compressed-tensors' tensors for a random [n, k] weight, and its float64
    decompression by compressed-tensors."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen)
    args = QuantizationArgs(
        num_bits=bits,
        type="int",
        symmetric=symmetric,
        strategy=strategy,
        group_size=group_size,
    )
    groups = k // group_size if group_size else 1
    g_idx = None
    if actorder:
        g_idx = torch.randperm(k, generator=gen) // group_size  # type: ignore[operator]
        # each group's columns, gathered: the observer sees the group's real members
        order = torch.argsort(g_idx, stable=True)
        wg = w[:, order].reshape(n, groups, -1)
    else:
        wg = w.reshape(n, groups, -1)
    scale, zero = calculate_qparams(wg.amin(-1), wg.amax(-1), args)
    d = _COMPRESSOR.compress_weight(
        w, scale, args, None if symmetric else zero, g_idx=g_idx
    )
    d["weight_scale"] = scale
    if g_idx is not None:
        d["weight_g_idx"] = g_idx.to(torch.int32)
    ref = {**d, "weight_scale": scale.double()}
    return d, _COMPRESSOR.decompress_weight(ref, args).double()


def zeros_of(d: dict[str, torch.Tensor], bits: int) -> torch.Tensor | None:
    zp = d.get("weight_zero_point")
    return None if zp is None else portable.unpack_cols(zp.t().contiguous(), bits).t()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("shape", [(16, 64), (40, 256)])
def test_unpacking_matches_vllm_and_compressed_tensors(bits: int, shape: tuple) -> None:
    gen = torch.Generator().manual_seed(bits)
    signed = torch.randint(
        -(1 << (bits - 1)), 1 << (bits - 1), shape, generator=gen
    ).to(torch.int8)
    packed = _COMPRESSOR.compress_weight(
        signed.float(),
        torch.ones(shape[0], 1),
        QuantizationArgs(num_bits=bits, strategy="channel", symmetric=True),
    )["weight_packed"]
    ours = portable.unpack_cols(packed, bits)
    wtype = scalar_types.uint4b8 if bits == 4 else scalar_types.uint8b128
    assert torch.equal(ours, unpack_quantized_values_into_int32(packed, wtype, 1))
    ct = unpack_from_int32(packed, bits, torch.Size(shape))
    assert torch.equal(ours - (1 << (bits - 1)), ct.to(torch.int32))
    assert torch.equal(ours, signed.to(torch.int32) + (1 << (bits - 1)))
    assert torch.equal(portable.pack_cols(ours, bits), packed)


CASES = [
    (4, "group", 32, True),
    (4, "group", 64, False),
    (4, "group", 128, True),
    (4, "channel", None, False),
    (4, "channel", None, True),
    (8, "group", 32, True),
    (8, "channel", None, False),
]


@pytest.mark.parametrize(("bits", "strategy", "group_size", "symmetric"), CASES)
@pytest.mark.parametrize("nk", [(48, 256), (24, 384)])
def test_portable_kernel_equals_compressed_tensors_decompression(
    bits: int, strategy: str, group_size: int | None, symmetric: bool, nk: tuple
) -> None:
    n, k = nk
    d, w = quantized(n, k, bits, strategy, group_size, symmetric, seed=k + bits)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(2))
    got = portable.wna16_linear(
        x,
        d["weight_packed"],
        d["weight_scale"],
        zeros_of(d, bits),
        bits,
        group_size or -1,
        bias=bias,
    )
    assert got.dtype == x.dtype and got.shape == (5, n)
    want = x.double() @ w.t() + bias.double()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


def test_chunks_cover_whole_groups_and_bound_the_float_weight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Small chunks (several per layer) give the same result; a chunk never holds
    more than CHUNK_ELEMENTS float weights nor cuts a group."""
    d, w = quantized(64, 512, 4, "group", 32, False, seed=5)
    x = torch.randn(3, 512, dtype=torch.float64)
    whole = portable.wna16_linear(
        x, d["weight_packed"], d["weight_scale"], zeros_of(d, 4), 4, 32
    )
    monkeypatch.setattr(portable, "CHUNK_ELEMENTS", 64 * 96)
    assert portable.chunk_columns(64, 512, 32, 4) == 96  # 3 groups a chunk
    chunked = portable.wna16_linear(
        x, d["weight_packed"], d["weight_scale"], zeros_of(d, 4), 4, 32
    )
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-4)  # float32 sums
    torch.testing.assert_close(chunked, x @ w.t(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("symmetric", [True, False])
def test_activation_order_is_served_by_sorting_k_once(symmetric: bool) -> None:
    d, w = quantized(32, 256, 4, "group", 64, symmetric, actorder=True, seed=7)
    packed, perm, groups = portable.sort_by_group(
        d["weight_packed"], d["weight_g_idx"], 4
    )
    assert torch.equal(groups, torch.arange(256) // 64)
    x = torch.randn(4, 256, dtype=torch.float64)
    got = portable.wna16_linear(
        x, packed, d["weight_scale"], zeros_of(d, 4), 4, 64, perm, col_groups=groups
    )
    torch.testing.assert_close(got, x @ w.t(), rtol=1e-5, atol=1e-4)
    # A row-parallel rank's slice: any number of columns of any group.
    half = slice(128, 256)
    packed, perm, groups = portable.sort_by_group(
        portable.pack_cols(portable.unpack_cols(d["weight_packed"], 4)[:, half], 4),
        d["weight_g_idx"][half],
        4,
    )
    got = portable.wna16_linear(
        x[:, half],
        packed,
        d["weight_scale"],
        zeros_of(d, 4),
        4,
        64,
        perm,
        col_groups=groups,
    )
    torch.testing.assert_close(got, x[:, half] @ w[:, half].t(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("bits", "group_size"), [(4, 32), (4, -1), (8, 64)])
def test_vendor_path_via_the_fake_gptq_gemm(
    bits: int, group_size: int, fake_vendor_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xspeedgate_ops import _gptq

    _gptq.reset()
    monkeypatch.setenv("VLLM_KUNLUN_EMULATION_VENDOR", "1")
    strategy = "channel" if group_size < 0 else "group"
    d, w = quantized(48, 256, bits, strategy, max(group_size, 0) or None, True)
    p = seam.prepare(
        d["weight_packed"],
        d["weight_scale"],
        None,
        None,
        bits,
        group_size,
        torch.float32,
    )
    assert p.gptq_layout and p.weight.shape == (256 * bits // 32, 48)
    x = torch.randn(2, 3, 256)
    got = seam.wna16_mm(x, p, None, bits, group_size)
    assert got.shape == (2, 3, 48)
    torch.testing.assert_close(got.double(), x.double() @ w.t(), rtol=1e-5, atol=1e-4)
    assert [c[0] for c in _gptq.CALLS] == ["gptq_gemm"]
    assert [s["path"] for s in seam.served()] == ["vendor"]


def test_asymmetric_layers_stay_portable_under_the_vendor_policy(
    fake_vendor_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xspeedgate_ops import _gptq

    _gptq.reset()
    monkeypatch.setenv("VLLM_KUNLUN_EMULATION_VENDOR", "1")
    d, w = quantized(16, 128, 4, "group", 32, False)
    p = seam.prepare(
        d["weight_packed"],
        d["weight_scale"],
        zeros_of(d, 4),
        None,
        4,
        32,
        torch.float32,
    )
    assert not p.gptq_layout
    x = torch.randn(3, 128)
    torch.testing.assert_close(
        seam.wna16_mm(x, p, None, 4, 32).double(),
        x.double() @ w.t(),
        rtol=1e-5,
        atol=1e-4,
    )
    assert _gptq.CALLS == []


def test_host_emulation_without_its_switch_runs_portable() -> None:
    d, _ = quantized(16, 64, 4, "group", 32, True)
    p = seam.prepare(
        d["weight_packed"], d["weight_scale"], None, None, 4, 32, torch.float32
    )
    seam.wna16_mm(torch.randn(1, 64), p, None, 4, 32)
    (entry,) = seam.served()
    assert entry["path"] == "portable"
    assert "VLLM_KUNLUN_EMULATION_VENDOR=1" in entry["reason"]


def config(
    k: int, k_part: int, group: int, wtype=scalar_types.uint4b8
) -> MPLinearLayerConfig:
    return MPLinearLayerConfig(
        full_weight_shape=(k, 64),
        partition_weight_shape=(k_part, 64),
        weight_type=wtype,
        act_type=torch.bfloat16,
        group_size=group,
        zero_points=False,
        has_g_idx=False,
    )


def test_can_implement_refuses_a_tensor_parallel_split_that_cuts_a_group() -> None:
    assert KunlunWNA16LinearKernel.can_implement(config(256, 128, 128)) == (True, None)
    assert KunlunWNA16LinearKernel.can_implement(config(256, 64, -1))[0]
    ok, why = KunlunWNA16LinearKernel.can_implement(config(384, 96, 64))
    assert not ok and why is not None
    assert "tensor parallel 4 cuts a quantization group" in why
    assert "group_size 64" in why and "divides 6" in why
    ok, why = KunlunWNA16LinearKernel.can_implement(
        config(256, 256, 128, scalar_types.float4_e2m1f)
    )
    assert not ok and "float4_e2m1f" in str(why)


def test_the_kernel_declines_on_other_platforms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm.platforms.cpu import CpuPlatform

    serve_platform(monkeypatch, CpuPlatform())
    ok, why = KunlunWNA16LinearKernel.can_implement(config(256, 256, 128))
    assert not ok and "vllm-kunlun platform" in str(why)


def test_the_table_patch_lists_our_kernel_first_and_reverts() -> None:
    from vllm.model_executor.layers.quantization.kernels import mixed_precision as mp

    table_patch.revert()
    before = list(mp._POSSIBLE_KERNELS)
    with pytest.raises(ValueError, match="Failed to find a kernel"):
        mp.choose_mp_linear_kernel(config(256, 256, 128), compute_capability=None)
    try:
        assert table_patch.apply() is True
        assert [KunlunWNA16LinearKernel, *before] == mp._POSSIBLE_KERNELS
        chosen = mp.choose_mp_linear_kernel(config(256, 256, 128))
        assert chosen is KunlunWNA16LinearKernel
    finally:
        table_patch.revert()
    assert before == mp._POSSIBLE_KERNELS


# ---- AWQ ------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(64, 32), (128, 96)])
def test_awq_packing_matches_vllm_awq_pack_and_unpacks_back(shape: tuple) -> None:
    from vllm.model_executor.layers.quantization.utils.quant_utils import awq_pack

    from vllm_kunlun.demo.tiny_int4 import awq_pack as writer_pack

    k, n = shape
    q = torch.randint(0, 16, (k, n), generator=torch.Generator().manual_seed(k))
    packed = writer_pack(q)
    assert torch.equal(packed, awq_pack(q, 4, k, n))
    assert torch.equal(portable.awq_unpack(packed), q.to(torch.int32))


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_awq_linear_method_against_the_dequantized_weight(
    group_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's own AWQConfig / create_weights, loaded with an AutoAWQ-packed weight, run
    by the plugin's method; the reference dequantizes AutoAWQ's unpacking in float64."""
    import vllm.model_executor.parameter as vllm_parameter

    monkeypatch.setattr(vllm_parameter, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(
        vllm_parameter, "get_tensor_model_parallel_world_size", lambda: 1
    )
    from tests.integration.int4_reference import awq_dequantize_reference
    from vllm_kunlun.demo.tiny_int4 import awq_config, awq_quantize
    from vllm_kunlun.ops.int4 import awq_method

    n, k = 64, 256
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(group_size))
    tensors = awq_quantize(w, group_size, torch.float16)
    method = awq_method.method_class()(AWQConfig.from_config(awq_config(group_size)))
    layer = torch.nn.Module()
    method.create_weights(
        layer, k, [n], k, n, torch.float16, weight_loader=lambda *a, **kw: None
    )
    for name, t in tensors.items():
        getattr(layer, name).data.copy_(t)
    method.process_weights_after_loading(layer)
    assert layer.qweight.shape == (n, k // 8)  # 4 bits a weight at rest
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(1)).half()
    got = method.apply(layer, x)
    assert got.dtype == torch.float16
    ref_w = awq_dequantize_reference(
        {f"p.{key}": t for key, t in tensors.items()}, "p", group_size
    )
    torch.testing.assert_close(
        got.double(), x.double() @ ref_w.t(), rtol=2e-3, atol=2e-2
    )


# ---- GPTQ -----------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_packing_matches_vllm_gptq_pack(bits: int) -> None:
    from vllm.model_executor.layers.quantization.utils.quant_utils import gptq_pack

    from tests.integration.int4_reference import gptq_unpack_reference
    from vllm_kunlun.demo.tiny_int4 import pack_rows

    k, n = 64, 24
    q = torch.randint(0, 1 << bits, (k, n), generator=torch.Generator().manual_seed(3))
    packed = pack_rows(q, bits)
    assert torch.equal(packed, gptq_pack(q, bits, k, n))
    assert torch.equal(gptq_unpack_reference(packed, bits, 0), q)


def gptq_layer(
    bits: int, desc_act: bool, sym: bool, group_size: int, monkeypatch, k=256, n=64
):
    """vLLM's own GPTQConfig / create_weights, loaded with a GPTQ-packed weight and
    processed by the plugin's method; with the float64 reference weight."""
    import vllm.model_executor.parameter as vllm_parameter

    from tests.integration.int4_reference import gptq_dequantize_reference
    from vllm_kunlun.demo.tiny_int4 import gptq_config, gptq_quantize
    from vllm_kunlun.ops.int4 import gptq_method

    monkeypatch.setattr(vllm_parameter, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(
        vllm_parameter, "get_tensor_model_parallel_world_size", lambda: 1
    )
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(bits + k))
    tensors = gptq_quantize(w, bits, group_size, desc_act, sym, torch.float16)
    ref = gptq_dequantize_reference(
        {f"p.{key}": t for key, t in tensors.items()}, "p", bits
    )
    method = gptq_method.method_class()(
        GPTQConfig.from_config(gptq_config(bits, group_size, desc_act, sym))
    )
    layer = torch.nn.Module()
    method.create_weights(
        layer, k, [n], k, n, torch.float16, weight_loader=lambda *a, **kw: None
    )
    for name, t in tensors.items():
        getattr(layer, name).data.copy_(t)
    method.process_weights_after_loading(layer)
    return method, layer, ref


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("desc_act", [False, True])
@pytest.mark.parametrize("sym", [True, False])
def test_gptq_linear_method_against_the_dequantized_weight(
    bits: int, desc_act: bool, sym: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    method, layer, ref = gptq_layer(bits, desc_act, sym, 64, monkeypatch)
    assert layer.qweight.shape == (64, 256 * bits // 32)  # bits a weight at rest
    assert (layer.wna16_index is not None) == desc_act
    x = torch.randn(2, 3, 256, generator=torch.Generator().manual_seed(1)).half()
    got = method.apply(layer, x)
    assert got.dtype == torch.float16 and got.shape == (2, 3, 64)
    torch.testing.assert_close(got.double(), x.double() @ ref.t(), rtol=2e-3, atol=2e-2)
    assert [s["path"] for s in seam.served()] == ["portable"]


@pytest.mark.parametrize(("bits", "desc_act"), [(4, True), (8, False)])
def test_symmetric_gptq_takes_the_vendor_gptq_gemm(
    bits: int, desc_act: bool, fake_vendor_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xspeedgate_ops import _gptq

    _gptq.reset()
    monkeypatch.setenv("VLLM_KUNLUN_EMULATION_VENDOR", "1")
    method, layer, ref = gptq_layer(bits, desc_act, True, 32, monkeypatch)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(2)).half()
    got = method.apply(layer, x)
    torch.testing.assert_close(got.double(), x.double() @ ref.t(), rtol=2e-3, atol=2e-2)
    assert [c[0] for c in _gptq.CALLS] == ["gptq_gemm"]
    assert [s["path"] for s in seam.served()] == ["vendor"]
