"""Selection of the plugin's MLA backend (vllm_kunlun/ops/mla/select.py) on both
platforms, and what it refuses with the reason: DeepSeek-V3.2's sparse attention, a
named vLLM MLA backend (CUDA binaries), a quantized latent cache; the FP8 checkpoints
DeepSeek releases are refused at configuration with how to dequantize them."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig

from vllm_kunlun.ops.int8.schemes import refuse_method
from vllm_kunlun.ops.mla.select import MLA_BACKEND_PATH, select_mla
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform
from vllm_kunlun.platforms.kunlun import KunlunPlatform

WHERE = "on Kunlun"


def sel(**kw: object) -> AttentionSelectorConfig:
    base: dict = dict(
        head_size=576,
        dtype=torch.bfloat16,
        kv_cache_dtype="auto",
        block_size=64,
        use_mla=True,
    )
    return AttentionSelectorConfig(**{**base, **kw})


@pytest.mark.parametrize("platform", [KunlunPlatform, KunlunHostEmulationPlatform])
@pytest.mark.parametrize("head_size,block", [(576, 64), (40, 16), (56, 5)])
def test_both_platforms_serve_any_latent_width_and_page(
    platform: type, head_size: int, block: int
) -> None:
    path = platform.get_attn_backend_cls(
        None, sel(head_size=head_size, block_size=block, dtype=torch.float32)
    )
    assert path == MLA_BACKEND_PATH


def test_explicit_custom_is_accepted_and_vllms_mla_backends_refused() -> None:
    assert select_mla(AttentionBackendEnum.CUSTOM, sel(), WHERE) == MLA_BACKEND_PATH
    for backend in (AttentionBackendEnum.FLASHMLA, AttentionBackendEnum.TRITON_MLA):
        with pytest.raises(ValueError, match=f"{backend.name} cannot serve MLA"):
            select_mla(backend, sel(), WHERE)


def test_deepseek_v32_sparse_attention_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError) as err:
        select_mla(None, sel(use_sparse=True), WHERE)
    text = str(err.value)
    assert "DeepSeek-V3.2" in text and "DSA lightning indexer" in text
    assert "Serve a dense MLA model" in text


def test_a_quantized_latent_cache_is_refused() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype not supported"):
        select_mla(None, sel(kv_cache_dtype="fp8"), WHERE)


def test_fp8_checkpoints_are_refused_with_how_to_dequantize() -> None:
    with pytest.raises(ValueError) as err:
        refuse_method("fp8", WHERE)
    text = str(err.value)
    assert "fp8_cast_bf16.py" in text and "--output-bf16-hf-path" in text
    with pytest.raises(ValueError) as other:
        refuse_method("bitsandbytes", WHERE)
    assert "fp8_cast_bf16" not in str(other.value)
