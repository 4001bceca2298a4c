"""The portable backend as vLLM sees it: name, selection, refusals, warm-up."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig

from vllm_kunlun.ops.attention import select as attention
from vllm_kunlun.ops.attention.backend import (
    PortableAttentionBackend,
    PortableAttentionImpl,
)
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform
from vllm_kunlun.platforms.kunlun import KunlunPlatform


@pytest.fixture(autouse=True)
def clean_custom_slot() -> Iterator[None]:
    AttentionBackendEnum.CUSTOM.clear_override()
    yield
    AttentionBackendEnum.CUSTOM.clear_override()


def selector(**kw: object) -> AttentionSelectorConfig:
    base: dict = dict(
        head_size=32, dtype=torch.float32, kv_cache_dtype="auto", block_size=16
    )
    return AttentionSelectorConfig(**{**base, **kw})


def impl(**kw: object) -> PortableAttentionImpl:
    args: dict = dict(num_heads=4, head_size=16, scale=0.25, num_kv_heads=2)
    return PortableAttentionImpl(**{**args, **kw})


def test_name_maps_back_to_vllms_custom_slot() -> None:
    # vLLM's Attention layer does AttentionBackendEnum[backend.get_name()].
    assert AttentionBackendEnum[PortableAttentionBackend.get_name()] is (
        AttentionBackendEnum.CUSTOM
    )
    assert attention.register() == attention.PORTABLE_BACKEND_PATH
    assert AttentionBackendEnum.CUSTOM.get_class() is PortableAttentionBackend


def test_someone_elses_custom_backend_is_kept() -> None:
    from vllm.v1.attention.backends.registry import register_backend

    register_backend(AttentionBackendEnum.CUSTOM, "their.module.Backend")
    assert attention.register() == "their.module.Backend"
    assert AttentionBackendEnum.CUSTOM.get_path() == "their.module.Backend"


def test_emulation_selects_portable_by_default_and_by_name() -> None:
    path = attention.PORTABLE_BACKEND_PATH
    plat = KunlunHostEmulationPlatform
    assert plat.get_attn_backend_cls(None, selector()) == path
    assert plat.get_attn_backend_cls(AttentionBackendEnum.CUSTOM, selector()) == path


def test_emulation_refuses_backends_that_need_vllm_c() -> None:
    with pytest.raises(ValueError, match=r"CPU_ATTN .*vllm\._C.*Use CUSTOM"):
        KunlunHostEmulationPlatform.get_attn_backend_cls(
            AttentionBackendEnum.CPU_ATTN, selector()
        )
    # MLA layers go to the plugin's MLA backend (tests/unit/ops/test_mla_select.py).
    mla = KunlunHostEmulationPlatform.get_attn_backend_cls(
        None, selector(use_mla=True, head_size=576)
    )
    assert mla == "vllm_kunlun.ops.mla.backend.PluginMLABackend"


def test_kunlun_takes_portable_only_by_explicit_choice() -> None:
    triton = AttentionBackendEnum.TRITON_ATTN.get_path()
    assert KunlunPlatform.get_attn_backend_cls(None, selector()) == triton
    assert (
        KunlunPlatform.get_attn_backend_cls(AttentionBackendEnum.CUSTOM, selector())
        == attention.PORTABLE_BACKEND_PATH
    )


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (selector(attn_type=AttentionType.ENCODER_DECODER), "attention type"),
        (selector(kv_cache_dtype="fp8"), "kv_cache_dtype"),
        (selector(dtype=torch.float64), "dtype"),
    ],
)
def test_unsupported_layers_fail_at_selection(
    config: AttentionSelectorConfig, reason: str
) -> None:
    with pytest.raises(ValueError, match=f"portable attention backend.*{reason}"):
        attention.select_portable(config)


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [
        ({"alibi_slopes": [0.5, 0.25, 0.1, 0.05]}, "ALiBi"),
        ({"attn_type": AttentionType.ENCODER_DECODER}, "encoder_decoder"),
        ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype='fp8'"),
        ({"use_alibi_sqrt": True}, "use_alibi_sqrt"),
    ],
)
def test_impl_refuses_what_it_cannot_do(kwargs: dict, what: str) -> None:
    with pytest.raises(NotImplementedError, match=f"does not support.*{what}"):
        impl(**kwargs)


def test_layers_with_sinks_select_the_portable_backend() -> None:
    # gpt-oss's layers: vLLM asks the backend whether it takes sinks.
    assert attention.select_portable(selector(has_sink=True)) == (
        attention.PORTABLE_BACKEND_PATH
    )


def test_impl_keeps_window_cap_and_sinks_for_the_kernel() -> None:
    sinks = torch.zeros(4)
    layer_impl = impl(sliding_window=128, logits_soft_cap=30.0, sinks=sinks)
    assert layer_impl.sliding_window == 128
    assert layer_impl.logits_soft_cap == 30.0
    assert layer_impl.sinks is sinks
    with pytest.raises(ValueError, match="one per query head"):
        impl(sinks=torch.zeros(3))


def test_warm_up_run_without_metadata_returns_zeros() -> None:
    layer_impl = impl()
    q = torch.randn(5, 4, 16)
    kv = torch.randn(5, 2, 16)
    kv_cache = torch.randn(2, 2, 16, 2, 16)
    before = kv_cache.clone()
    out = torch.full((5, 4, 16), float("nan"))
    result = layer_impl.forward(None, q, kv, kv, kv_cache, None, output=out)  # type: ignore[arg-type]
    assert result is out
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(kv_cache, before)  # nothing written during warm-up


def test_portable_serves_encoder_only_layers() -> None:
    # Pooling encoders (BERT, XLM-R): bidirectional, no KV cache (encoder_portable.py).
    sel = selector(attn_type=AttentionType.ENCODER_ONLY)
    assert attention.select_portable(sel) == attention.PORTABLE_BACKEND_PATH
    assert impl(attn_type=AttentionType.ENCODER_ONLY).attn_type == "encoder_only"
