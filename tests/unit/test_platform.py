"""KunlunPlatform's methods, called directly (no engine)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from vllm.platforms.interface import Platform, PlatformEnum
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig

from vllm_kunlun.platforms.kunlun import KunlunPlatform

SEL = AttentionSelectorConfig(
    head_size=128, dtype=torch.bfloat16, kv_cache_dtype=None, block_size=16
)


def test_identity() -> None:
    p = KunlunPlatform
    assert issubclass(p, Platform)
    assert p._enum is PlatformEnum.OOT
    assert (p.device_name, p.device_type, p.dispatch_key) == ("cuda", "cuda", "CUDA")
    assert (p.dist_backend, p.ray_device_key) == ("nccl", "GPU")
    assert p.device_control_env_var == "XPU_VISIBLE_DEVICES"
    inst = object.__new__(p)  # no __init__: keep this process's torch untouched
    assert inst.is_cuda() is False and inst.is_out_of_tree() is True


def test_every_base_not_implemented_method_is_overridden() -> None:
    not_implemented = []
    for name, attr in vars(Platform).items():
        func = getattr(attr, "__func__", attr)
        code = getattr(func, "__code__", None)
        if code is not None and "NotImplementedError" in code.co_names:
            not_implemented.append(name)
    assert "get_device_name" in not_implemented  # the scan finds them
    missing = [
        n
        for n in not_implemented
        if not any(n in vars(k) for k in KunlunPlatform.__mro__ if k is not Platform)
    ]
    assert missing == []


def test_device_count_comes_from_torch_xmlir(
    fake_vendor_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_XMLIR_DEVICES", "3")
    assert KunlunPlatform.device_count() == 3


def test_device_count_is_zero_without_torch_xmlir() -> None:
    assert KunlunPlatform.device_count() == 0


def test_total_memory_is_the_device_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    p800 = SimpleNamespace(total_memory=103_100_000_000, uuid=None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: p800)
    assert KunlunPlatform.get_device_total_memory(0) == 103_100_000_000
    # Without a uuid from the runtime the physical index identifies the card.
    monkeypatch.setenv("XPU_VISIBLE_DEVICES", "4,5")
    assert KunlunPlatform.get_device_uuid(1) == "KUNLUN-5"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_supported_dtypes(dtype: torch.dtype) -> None:
    KunlunPlatform.check_if_supports_dtype(dtype)


def test_unsupported_dtype_names_the_fix() -> None:
    with pytest.raises(ValueError, match="use --dtype bfloat16"):
        KunlunPlatform.check_if_supports_dtype(torch.float64)


def test_default_attention_backend_is_triton() -> None:
    path = KunlunPlatform.get_attn_backend_cls(None, SEL)
    assert path == AttentionBackendEnum.TRITON_ATTN.get_path()


def test_explicit_triton_choice_is_honoured() -> None:
    path = KunlunPlatform.get_attn_backend_cls(AttentionBackendEnum.TRITON_ATTN, SEL)
    assert path == AttentionBackendEnum.TRITON_ATTN.get_path()


@pytest.mark.parametrize(
    ("backend", "why"),
    [
        (AttentionBackendEnum.FLASH_ATTN, "FlashAttention"),
        (AttentionBackendEnum.FLASHINFER, "flashinfer"),
    ],
)
def test_backends_needing_vllm_c_are_refused(
    backend: AttentionBackendEnum, why: str
) -> None:
    with pytest.raises(ValueError, match=why) as err:
        KunlunPlatform.get_attn_backend_cls(backend, SEL)
    assert "TRITON_ATTN" in str(err.value)


def test_mla_is_refused() -> None:
    with pytest.raises(ValueError, match="no MLA attention backend"):
        KunlunPlatform.get_attn_backend_cls(None, SEL._replace(use_mla=True))


def test_lora_decision_is_explicit() -> None:
    with pytest.raises(NotImplementedError, match="--enable-lora"):
        KunlunPlatform.get_punica_wrapper()


def test_stateless_gloo_group_really_communicates() -> None:
    from torch.distributed import HashStore, PrefixStore

    store = PrefixStore("test", HashStore())
    pg = KunlunPlatform.stateless_init_device_torch_dist_pg(
        "gloo", store, 0, 1, timedelta(seconds=30)
    )
    t = torch.tensor([2.0, 3.0])
    pg.allreduce([t]).wait()
    assert t.tolist() == [2.0, 3.0]
    assert pg.size() == 1 and pg.rank() == 0


def test_unknown_backend_is_refused() -> None:
    from torch.distributed import HashStore, PrefixStore

    with pytest.raises(ValueError, match="nccl and gloo backends"):
        KunlunPlatform.stateless_init_device_torch_dist_pg(
            "mpi", PrefixStore("x", HashStore()), 0, 1, timedelta(seconds=5)
        )


def test_emulation_groups_are_gloo_only() -> None:
    from torch.distributed import HashStore, PrefixStore

    from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform

    with pytest.raises(ValueError, match="supports the gloo backends, not 'nccl'"):
        KunlunHostEmulationPlatform.stateless_init_device_torch_dist_pg(
            "nccl", PrefixStore("y", HashStore()), 0, 1, timedelta(seconds=5)
        )
