"""The GDN state dtype rule (``vllm_kunlun/ops/gdn/state_dtype.py``), shared by the
model, the engine guard, the KV budget and the doctor: the recurrent state takes the
operator's ``--mamba-ssm-cache-dtype``, else the checkpoint's ``mamba_ssm_dtype``, else
the conv state's dtype, which is vLLM's ``--mamba-cache-dtype`` rule."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_kunlun.ops.gdn.state_dtype import checkpoint_ssm_dtype, gdn_state_dtypes


@pytest.mark.parametrize(
    ("model", "cache", "ssm", "checkpoint", "want"),
    [
        ("bfloat16", "auto", "auto", None, ("bfloat16", "bfloat16")),  # vLLM's rule
        ("bfloat16", "auto", "auto", "float32", ("bfloat16", "float32")),
        (torch.float16, "auto", "auto", "float32", ("float16", "float32")),
        ("bfloat16", "auto", "float16", "float32", ("bfloat16", "float16")),
        ("bfloat16", "float32", "auto", None, ("float32", "float32")),
        ("float32", "auto", "auto", "float32", ("float32", "float32")),
    ],
)
def test_the_rule(
    model: object, cache: str, ssm: str, checkpoint: str | None, want: tuple
) -> None:
    assert gdn_state_dtypes(model, cache, ssm, checkpoint) == want


def test_vllms_own_rule_is_the_fallback() -> None:
    """Without an operator flag or a checkpoint field the plugin keeps vLLM's dtypes."""
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator

    for model, cache in ((torch.bfloat16, "auto"), (torch.float16, "float32")):
        vllm = MambaStateDtypeCalculator.gated_delta_net_state_dtype(model, cache)
        ours = gdn_state_dtypes(model, cache)
        assert tuple(getattr(torch, d) for d in ours) == vllm


@pytest.mark.parametrize(
    ("config", "want"),
    [
        ({"mamba_ssm_dtype": "float32"}, "float32"),
        ({"text_config": {"mamba_ssm_dtype": "float32"}}, "float32"),
        (
            SimpleNamespace(text_config=SimpleNamespace(mamba_ssm_dtype="float32")),
            "float32",
        ),
        ({"mamba_ssm_dtype": "int8"}, None),
        ({}, None),
    ],
)
def test_the_checkpoint_field_is_read_from_either_level(
    config: object, want: str | None
) -> None:
    assert checkpoint_ssm_dtype(config) == want
