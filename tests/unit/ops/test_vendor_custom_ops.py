"""The CustomOps replaced for the vendor kernels against vLLM's own native ops.

Each replacement's ``forward_oot`` runs through tests/fakes/kunlun_ops (plain-torch
kernels with the observed semantics, checking dtypes, layouts and devices) and is
compared with the same layer's ``forward_native``, vLLM's code, on random inputs in the
shapes and dtypes models use. Then the fallbacks: a missing kernel, inputs the call form
cannot express, a kernel that raises: each goes to vLLM's native path, with its reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm.config import (
    CompilationConfig,
    DeviceConfig,
    VllmConfig,
    set_current_vllm_config,
)

from vllm_kunlun.ops import chooser, routes
from vllm_kunlun.ops.contract import VENDOR_CONTRACT

TOL = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    # vLLM rounds the normalised value to bf16 before the weight; the kernel does not.
    torch.bfloat16: {"atol": 3e-2, "rtol": 2e-2},
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def vllm_config() -> Iterator[VllmConfig]:
    cfg = VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        compilation_config=CompilationConfig(custom_ops=["all"]),
    )
    with set_current_vllm_config(cfg):
        yield cfg


@pytest.fixture
def fake_ops(
    fake_vendor_path: Path, monkeypatch: pytest.MonkeyPatch, vllm_config: VllmConfig
) -> Any:
    """The fake kunlun_ops, a platform that wants vendor kernels, and a spy that
    records the keyword names of every kernel call."""
    import kunlun_ops

    kunlun_ops.reset()
    routes.forget_routes()
    monkeypatch.setattr(chooser, "vendor_policy", lambda: (True, "test"))
    kunlun_ops.KEYWORDS = []
    for name in VENDOR_CONTRACT["kunlun_ops"]:
        fn = getattr(kunlun_ops, name)

        def spy(*args: Any, _fn: Any = fn, _name: str = name, **kw: Any) -> Any:
            kunlun_ops.KEYWORDS.append((_name, tuple(kw)))
            return _fn(*args, **kw)

        monkeypatch.setattr(kunlun_ops, name, spy)
    yield kunlun_ops
    routes.forget_routes()


def kernel_calls(ops: Any) -> list[str]:
    return [c.name for c in ops.CALLS]


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.float(), want.float(), **TOL[want.dtype])


def test_every_keyword_passed_is_declared_in_the_contract(fake_ops: Any) -> None:
    """Run one layer of each kind, then compare what was passed with the contract."""
    from vllm_kunlun.ops.custom_ops.activation import KunlunSiluAndMul
    from vllm_kunlun.ops.custom_ops.norms import (
        KunlunGemmaRMSNorm,
        KunlunRMSNorm,
        KunlunRMSNormGated,
    )
    from vllm_kunlun.ops.custom_ops.rotary import (
        KunlunMRotaryEmbedding,
        KunlunRotaryEmbedding,
    )

    x = torch.randn(3, 64)
    for norm in (KunlunRMSNorm(64), KunlunGemmaRMSNorm(64)):
        norm.forward_oot(x)
        norm.forward_oot(x, x.clone())
    KunlunRMSNormGated(64).forward_oot(x, torch.randn(3, 64))
    KunlunSiluAndMul().forward_oot(x)
    pos = torch.arange(3)
    q, k = torch.randn(3, 128), torch.randn(3, 64)
    KunlunRotaryEmbedding(32, 32, 64, 1e4, True, torch.float32).forward_oot(pos, q, k)
    mrope = KunlunMRotaryEmbedding(32, 32, 64, 1e4, True, torch.float32, [4, 6, 6])
    mrope.forward_oot(torch.stack([pos] * 3), q, k)
    used = {name for name, _ in fake_ops.KEYWORDS}
    norms_rotary_act = set(VENDOR_CONTRACT["kunlun_ops"]) - {
        "top_k_top_p_sampling_from_probs",
        "reshape_and_cache_flash",
        "paged_attention",
        "prefill_attention",
        "quant2d",  # the W8A8 int8 path (tests/unit/test_int8_*)
        "matmul",
        "fused_recurrent_gated_delta_rule_fwdv2",  # the GDN decode (test_gdn_seam.py)
        "moe_ffn_block",  # the routed MoE block (test_moe_seam.py)
        "moe_softmax_topk_norm",  # vLLM FusedMoE routing (test_moe_fused_method.py)
        "moe_sigmoid_group_topk_norm",
        "concat_and_cache_mla",  # the MLA cache write and decode (test_mla_seam.py)
        "fwd_kvcache_mla",
    }
    assert used == norms_rotary_act
    for name, keywords in fake_ops.KEYWORDS:
        assert set(keywords) <= set(VENDOR_CONTRACT["kunlun_ops"][name]), name
    assert all(s["native_calls"] == 0 for s in routes.status().values())


# ---- RMSNorm and fused add + RMSNorm --------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 5120])
def test_rms_norm_matches_vllm(fake_ops: Any, dtype: torch.dtype, hidden: int) -> None:
    from vllm_kunlun.ops.custom_ops.norms import KunlunRMSNorm

    gen = torch.Generator().manual_seed(hidden)
    layer = KunlunRMSNorm(hidden, eps=1e-6, dtype=dtype)
    layer.weight.data = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    x = torch.randn(7, hidden, generator=gen).to(dtype)
    residual = torch.randn(7, hidden, generator=gen).to(dtype)

    close(layer.forward_oot(x), layer.forward_native(x))
    out, res = layer.forward_oot(x, residual)
    want_out, want_res = layer.forward_native(x.clone(), residual.clone())
    close(out, want_out)
    close(res, want_res)
    assert kernel_calls(fake_ops) == ["rmsnorm", "add_rmsnorm"]
    assert layer.kunlun_route.vendor_calls == 2


def test_rms_norm_of_qk_heads_takes_a_strided_3d_view(fake_ops: Any) -> None:
    """Qwen3's q_norm/k_norm: a [tokens, heads, head_dim] view into the qkv output."""
    from vllm_kunlun.ops.custom_ops.norms import KunlunRMSNorm

    layer = KunlunRMSNorm(128, eps=1e-6, dtype=torch.bfloat16)
    layer.weight.data.normal_(1.0, 0.1)
    qkv = torch.randn(5, (8 + 2 + 2) * 128, dtype=torch.bfloat16)
    q = qkv.split([8 * 128, 256, 256], dim=-1)[0].view(5, 8, 128)
    assert not q.is_contiguous()
    got = layer.forward_oot(q)
    assert got.shape == q.shape
    close(got, layer.forward_native(q))
    assert fake_ops.CALLS[0].args["x"]["shape"] == [40, 128]


def test_rms_norm_partial_variance_falls_back(fake_ops: Any) -> None:
    from vllm_kunlun.ops.custom_ops.norms import KunlunRMSNorm

    layer = KunlunRMSNorm(64, var_hidden_size=32)
    x = torch.randn(2, 3, 64)
    torch.testing.assert_close(layer.forward_oot(x), layer.forward_native(x))
    assert kernel_calls(fake_ops) == []
    assert layer.kunlun_route.native_calls == 1
    assert "var_hidden_size" in next(iter(layer.kunlun_route.reasons))


# ---- Gemma RMSNorm ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemma_rms_norm_matches_vllm(fake_ops: Any, dtype: torch.dtype) -> None:
    from vllm_kunlun.ops.custom_ops.norms import KunlunGemmaRMSNorm

    gen = torch.Generator().manual_seed(1)
    layer = KunlunGemmaRMSNorm(2048, eps=1e-6)
    layer.weight.data = (0.2 * torch.randn(2048, generator=gen)).to(dtype)
    x = torch.randn(6, 2048, generator=gen).to(dtype)
    residual = torch.randn(6, 2048, generator=gen).to(dtype)
    close(layer.forward_oot(x), layer.forward_native(x))
    out, res = layer.forward_oot(x, residual)
    want_out, want_res = layer.forward_native(x.clone(), residual.clone())
    close(out, want_out)
    close(res, want_res.to(dtype))  # vLLM keeps an fp16 residual sum in float32
    assert kernel_calls(fake_ops) == ["gemma_rmsnorm", "gemma_add_rmsnorm"]


# ---- gated RMSNorm (Qwen3-Next / Qwen3.5 linear attention) --------------------------------


@pytest.mark.parametrize("norm_before_gate", [True, False])
@pytest.mark.parametrize("group_size", [None, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_rms_norm_matches_vllm(
    fake_ops: Any, norm_before_gate: bool, group_size: int | None, dtype: torch.dtype
) -> None:
    from vllm_kunlun.ops.custom_ops.norms import KunlunRMSNormGated

    gen = torch.Generator().manual_seed(2)
    layer = KunlunRMSNormGated(
        128, eps=1e-6, group_size=group_size, norm_before_gate=norm_before_gate,
        dtype=dtype,
    )  # fmt: skip
    layer.weight.data = (1 + 0.1 * torch.randn(128, generator=gen)).to(dtype)
    x = torch.randn(9, 128, generator=gen).to(dtype)
    z = torch.randn(9, 128, generator=gen).to(dtype)
    # vLLM's native path computes in the input dtype; compare in float32 for bf16.
    want = layer.float().forward_native(x.float(), z.float())
    layer.to(dtype)
    close(layer.forward_oot(x, z), want.to(dtype))
    assert kernel_calls(fake_ops) == ["rms_norm_gated"]


def test_gated_rms_norm_without_gate_falls_back(fake_ops: Any) -> None:
    from vllm_kunlun.ops.custom_ops.norms import KunlunRMSNormGated

    layer = KunlunRMSNormGated(64)
    x = torch.randn(3, 64)
    torch.testing.assert_close(layer.forward_oot(x), layer.forward_native(x))
    assert kernel_calls(fake_ops) == []
    assert any("no gate" in r for r in layer.kunlun_route.reasons)


# ---- rotary embedding -------------------------------------------------------------------


def qkv_views(
    tokens: int, heads: int, kv_heads: int, head: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k as vLLM's attention layers hand them over: views into one qkv tensor."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head, generator=gen).to(dtype)
    q, k, _ = qkv.split([heads * head, kv_heads * head, kv_heads * head], dim=-1)
    return q, k


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("head", "rotary_dim", "neox"), [(128, 128, True), (128, 64, True), (64, 64, False)]
)
def test_rotary_embedding_matches_vllm(
    fake_ops: Any, dtype: torch.dtype, head: int, rotary_dim: int, neox: bool
) -> None:
    from vllm_kunlun.ops.custom_ops.rotary import KunlunRotaryEmbedding

    rope = KunlunRotaryEmbedding(head, rotary_dim, 4096, 1e6, neox, dtype)
    q, k = qkv_views(11, 8, 2, head, dtype, seed=head + rotary_dim)
    positions = torch.randint(
        0, 4096, (11,), generator=torch.Generator().manual_seed(0)
    )
    want_q, want_k = rope.forward_native(positions, q.clone(), k.clone())
    got_q, got_k = rope.forward_oot(positions, q, k)
    close(got_q, want_q)
    close(got_k, want_k)
    assert got_q.shape == q.shape and got_k.shape == k.shape
    assert kernel_calls(fake_ops) == ["rotary_embedding"]


def test_rotary_embedding_without_key_falls_back(fake_ops: Any) -> None:
    from vllm_kunlun.ops.custom_ops.rotary import KunlunRotaryEmbedding

    rope = KunlunRotaryEmbedding(64, 64, 128, 1e4, True, torch.float32)
    q = torch.randn(3, 256)
    want, _ = rope.forward_native(torch.arange(3), q.clone(), None)
    got, key = rope.forward_oot(torch.arange(3), q, None)
    torch.testing.assert_close(got, want)
    assert key is None and kernel_calls(fake_ops) == []


# ---- M-RoPE -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mrope_matches_vllm_for_thw_positions(
    fake_ops: Any, dtype: torch.dtype
) -> None:
    """Qwen2-VL's layout: rotary_dim 128, sections [16, 24, 24] of T/H/W frequencies."""
    from vllm_kunlun.ops.custom_ops.rotary import KunlunMRotaryEmbedding

    rope = KunlunMRotaryEmbedding(128, 128, 2048, 1e6, True, dtype, [16, 24, 24])
    q, k = qkv_views(9, 4, 2, 128, dtype, seed=3)
    positions = torch.randint(
        0, 2048, (3, 9), generator=torch.Generator().manual_seed(4)
    )
    want_q, want_k = rope.forward_native(positions, q.clone(), k.clone())
    got_q, got_k = rope.forward_oot(positions, q, k)
    close(got_q, want_q)
    close(got_k, want_k)
    # Text-only positions are plain RoPE, on the rotary_embedding kernel.
    flat = positions[0]
    want_q, _ = rope.forward_native(flat, q.clone(), k.clone())
    close(rope.forward_oot(flat, q, k)[0], want_q)
    assert kernel_calls(fake_ops) == ["mrotary_embedding_neox", "rotary_embedding"]


def test_interleaved_mrope_falls_back(fake_ops: Any) -> None:
    from vllm_kunlun.ops.custom_ops.rotary import KunlunMRotaryEmbedding

    rope = KunlunMRotaryEmbedding(
        64, 64, 256, 1e4, True, torch.float32, [8, 12, 12], mrope_interleaved=True
    )
    q, k = qkv_views(4, 2, 1, 64, torch.float32, seed=5)
    positions = torch.randint(0, 256, (3, 4))
    want = rope.forward_native(positions, q.clone(), k.clone())
    got = rope.forward_oot(positions, q, k)
    torch.testing.assert_close(got, want)
    assert kernel_calls(fake_ops) == []
    assert any("interleaved" in r for r in rope.kunlun_route.reasons)


# ---- SiLU-and-mul -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7, 2 * 17408), (2, 3, 256)])
def test_silu_and_mul_matches_vllm(
    fake_ops: Any, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    from vllm_kunlun.ops.custom_ops.activation import KunlunSiluAndMul

    layer = KunlunSiluAndMul()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(6)).to(dtype)
    close(layer.forward_oot(x), layer.forward_native(x))
    assert kernel_calls(fake_ops) == ["silu_and_mul"]


# ---- fallbacks ----------------------------------------------------------------------------


def test_missing_kernel_falls_back_with_the_reason(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_kunlun.ops.custom_ops.activation import KunlunSiluAndMul

    monkeypatch.delattr(fake_ops, "silu_and_mul")
    layer = KunlunSiluAndMul()
    x = torch.randn(4, 32)
    torch.testing.assert_close(layer.forward_oot(x), layer.forward_native(x))
    layer.forward_oot(x)
    assert not layer.kunlun_route.ready
    st = routes.status()["silu_and_mul"]
    assert (st["vendor_calls"], st["native_calls"]) == (0, 2)
    assert st["native_reasons"] == [
        "kunlun_ops (0.1.58) has no silu_and_mul (the validated kunlun_ops 0.1.58 has it)"
    ]


def test_kernel_that_raises_closes_the_route_and_says_why_once(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_kunlun.ops.custom_ops.norms import KunlunRMSNorm

    logged: list[str] = []
    monkeypatch.setattr(
        routes.logger, "warning_once", lambda msg, *a: logged.append(msg % a)
    )

    def broken(*args: Any) -> None:
        raise RuntimeError("XPU_ERR 0x7 unsupported shape (test)")

    monkeypatch.setattr(fake_ops, "rmsnorm", broken)
    layer = KunlunRMSNorm(64)
    x = torch.randn(3, 64)
    for _ in range(3):
        torch.testing.assert_close(layer.forward_oot(x), layer.forward_native(x))
    assert not layer.kunlun_route.ready
    assert layer.kunlun_route.native_calls == 3
    assert logged == [
        "vllm-kunlun: rms_norm falls back to vLLM's native torch path: the kernel "
        "raised RuntimeError: XPU_ERR 0x7 unsupported shape (test)"
    ]


@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "qkv-views"])
@pytest.mark.parametrize("kernel", ["rotary_embedding", "mrotary_embedding_neox"])
def test_rotary_kernel_that_rotated_then_raised_is_not_applied_twice(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch, kernel: str, contiguous: bool
) -> None:
    """The kernels rotate in place. One that wrote its result and then raised: the
    native fallback must see the inputs as they were (vLLM's answer, rotated once),
    and the caller's tensors are left alone. Contiguous q/k (as after Qwen3's q/k
    norms) are where an in-place kernel would write into the caller's own tensors."""
    from vllm_kunlun.ops.custom_ops.rotary import KunlunMRotaryEmbedding

    rotate = getattr(fake_ops, kernel)

    def rotate_then_raise(*args: Any, **kwargs: Any) -> None:
        rotate(*args, **kwargs)
        raise RuntimeError("XPU_ERR 0x9 after the write (test)")

    monkeypatch.setattr(fake_ops, kernel, rotate_then_raise)
    rope = KunlunMRotaryEmbedding(64, 64, 256, 1e4, True, torch.float32, [8, 12, 12])
    q, k = qkv_views(5, 4, 2, 64, torch.float32, seed=9)
    if contiguous:
        q, k = q.contiguous(), k.contiguous()
    shape = (3, 5) if kernel == "mrotary_embedding_neox" else (5,)
    positions = torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(9))
    q0, k0 = q.clone(), k.clone()
    want_q, want_k = rope.forward_native(positions, q.clone(), k.clone())
    got_q, got_k = rope.forward_oot(positions, q, k)
    assert kernel_calls(fake_ops) == [kernel]  # the kernel ran and wrote
    assert not rope.kunlun_route.ready and rope.kunlun_route.native_calls == 1
    torch.testing.assert_close(got_q, want_q)
    torch.testing.assert_close(got_k, want_k)
    assert torch.equal(q, q0) and torch.equal(k, k0)


def test_platform_that_wants_no_vendor_kernels_keeps_native(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_kunlun.ops.custom_ops.norms import KunlunRMSNorm

    monkeypatch.setattr(chooser, "vendor_policy", lambda: (False, "not wanted"))
    layer = KunlunRMSNorm(64)
    x = torch.randn(3, 64)
    torch.testing.assert_close(layer.forward_oot(x), layer.forward_native(x))
    assert kernel_calls(fake_ops) == [] and layer.kunlun_route.reasons == {"not wanted"}
