"""The Qwen3.5 deployments refused at engine start
(vllm_kunlun/guards/qwen3_5_deployment.py): each rule on a config shaped like vLLM's,
the architectures it applies to, and its call from the engine-start guards
(``engine_checks.check_engine_config``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from vllm_kunlun.guards import engine_checks
from vllm_kunlun.guards.qwen3_5_deployment import (
    qwen3_5_deployment_guard,
    refuse_unsupported,
    refuse_unsupported_speculation,
)

MOE = {
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
}


def _qwen3_5_config(
    tp: int,
    arch: str = "Qwen3_5ForConditionalGeneration",
    ep: bool = False,
    mode: str = "align",
    spec: Any = None,
    **fields: Any,
) -> SimpleNamespace:
    text = SimpleNamespace(
        **{
            "num_experts": 0,
            "attention_bias": False,
            "num_attention_heads": 24,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 48,
            **fields,
        },
    )
    return SimpleNamespace(
        model_config=SimpleNamespace(
            hf_text_config=text, architecture=arch, architectures=[arch]
        ),
        parallel_config=SimpleNamespace(
            tensor_parallel_size=tp, enable_expert_parallel=ep
        ),
        speculative_config=spec,
        cache_config=SimpleNamespace(mamba_cache_mode=mode),
    )


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_qwen3_5_heads_the_log_shards_pass(tp: int) -> None:
    refuse_unsupported(_qwen3_5_config(tp))  # type: ignore[arg-type]
    refuse_unsupported(_qwen3_5_config(tp, **MOE), moe=True)  # type: ignore[arg-type]


def test_qwen3_5_heads_a_tp_size_cannot_shard_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="linear_num_key_heads=2, which tensor "):
        refuse_unsupported(
            _qwen3_5_config(4, num_attention_heads=4, linear_num_key_heads=2)  # type: ignore[arg-type]
        )


def test_other_speculative_methods_on_qwen3_5_are_refused_naming_mtp() -> None:
    for method in ("ngram", "draft_model", "eagle"):
        config = SimpleNamespace(speculative_config=SimpleNamespace(method=method))
        with pytest.raises(ValueError, match='"method": "mtp"'):
            refuse_unsupported_speculation(config)  # type: ignore[arg-type]
    ok = SimpleNamespace(speculative_config=SimpleNamespace(method="mtp"))
    refuse_unsupported_speculation(ok)  # type: ignore[arg-type]
    refuse_unsupported_speculation(SimpleNamespace(speculative_config=None))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("moe", "fields", "match"),
    [
        (False, MOE, r"num_experts=8: a Qwen3\.5-MoE checkpoint needs .*Qwen3_5Moe"),
        (True, {}, r"num_experts=0: a dense Qwen3\.5 checkpoint needs"),
        (False, {"attention_bias": True}, "attention_bias=true"),
        (True, {**MOE, "moe_intermediate_size": 6}, "moe_intermediate_size=6, which"),
        (True, {**MOE, "num_experts_per_tok": 9}, "num_experts_per_tok=9 of"),
    ],
)
def test_what_the_models_do_not_implement_is_refused_by_name(
    moe: bool, fields: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        refuse_unsupported(_qwen3_5_config(4, **fields), moe=moe)  # type: ignore[arg-type]


def test_expert_parallel_shards_whole_experts() -> None:
    config = _qwen3_5_config(4, ep=True, **{**MOE, "num_experts": 6})
    with pytest.raises(ValueError, match=r"num_experts=6, which .*whole experts"):
        refuse_unsupported(config, moe=True)  # type: ignore[arg-type]
    # without expert parallelism the experts' widths are split instead
    refuse_unsupported(  # type: ignore[arg-type]
        _qwen3_5_config(4, **{**MOE, "num_experts": 6}), moe=True
    )


def test_prefix_caching_only_in_align_mode() -> None:
    with pytest.raises(ValueError, match="--mamba-cache-mode align"):
        refuse_unsupported(_qwen3_5_config(1, mode="all"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("arch", "match"),
    [
        ("Qwen3_5ForCausalLM", r"speculative method 'ngram' on Qwen3\.5"),
        ("Qwen3_5ForConditionalGeneration", r"speculative method 'ngram' on Qwen3\.5"),
        # the dense checkpoint contradicts the MoE architecture first
        ("Qwen3_5MoeForCausalLM", r"num_experts=0: a dense Qwen3\.5"),
        ("Qwen3NextForCausalLM", None),
        ("Qwen3ForCausalLM", None),
    ],
)
def test_the_engine_start_guards_refuse_qwen3_5_deployments_only(
    monkeypatch: pytest.MonkeyPatch, arch: str, match: str | None
) -> None:
    for guard in ("stack_guard", "config_range_guard", "pp_partition_guard"):
        monkeypatch.setattr(engine_checks, guard, lambda *a: None)
    config = _qwen3_5_config(1, arch=arch, spec=SimpleNamespace(method="ngram"))
    if match is None:
        engine_checks.check_engine_config(config, budget=False)  # type: ignore[arg-type]
        return
    with pytest.raises(ValueError, match=match):
        engine_checks.check_engine_config(config, budget=False)  # type: ignore[arg-type]


def test_no_model_config_no_check() -> None:
    qwen3_5_deployment_guard(SimpleNamespace(model_config=None))  # type: ignore[arg-type]
