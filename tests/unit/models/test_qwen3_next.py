"""The plugin's Qwen3-Next refuses at start what it does not serve, naming the fix."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from vllm_kunlun.models.qwen3_next import _refuse_unsupported


def _config(tp: int = 1, method: str | None = None, **fields: Any) -> Any:
    hf = SimpleNamespace(
        **{
            "num_attention_heads": 16,
            "linear_num_key_heads": 16,
            "num_hidden_layers": 48,
            "num_experts": 512,
            **fields,
        }
    )
    return SimpleNamespace(
        model_config=SimpleNamespace(hf_config=hf),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp),
        speculative_config=None if method is None else SimpleNamespace(method=method),
    )


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
def test_released_head_counts_at_their_usual_tp_are_served(tp: int) -> None:
    _refuse_unsupported(_config(tp))
    _refuse_unsupported(_config(tp, "mtp"))  # vLLM's name for qwen3_next_mtp


@pytest.mark.parametrize(
    ("tp", "fields", "named"),
    [
        (3, {}, "num_attention_heads=16, which tensor parallel size 3"),
        (4, {"linear_num_key_heads": 6}, "linear_num_key_heads=6"),
    ],
)
def test_heads_tp_does_not_divide_are_refused(
    tp: int, fields: dict[str, int], named: str
) -> None:
    with pytest.raises(ValueError, match=named) as err:
        _refuse_unsupported(_config(tp, **fields))
    assert "--tensor-parallel-size" in str(err.value)


@pytest.mark.parametrize("method", ["ngram", "eagle", "draft_model"])
def test_speculative_methods_other_than_mtp_are_refused(method: str) -> None:
    with pytest.raises(ValueError, match=f"speculative method '{method}'") as err:
        _refuse_unsupported(_config(method=method))
    assert "qwen3_next_mtp" in str(err.value)


# ---- dense-only configs ------------------------------------------------------------


def test_a_config_without_sparse_layers_reports_no_moe_layers() -> None:
    """vLLM's set_moe_parameters raises "No Qwen3Next layer found" for it; ours
    reports none (transformers serves such a config)."""
    from vllm.model_executor.models import qwen3_next as upstream

    from vllm_kunlun.models.qwen3_next import Qwen3NextForCausalLM

    dense = SimpleNamespace(model=SimpleNamespace(layers=[SimpleNamespace(mlp=None)]))
    with pytest.raises(RuntimeError, match="No Qwen3Next layer found"):
        upstream.Qwen3NextForCausalLM.set_moe_parameters(dense)  # type: ignore[arg-type]
    Qwen3NextForCausalLM.set_moe_parameters(dense)  # type: ignore[arg-type]
    assert dense.num_moe_layers == 0 and dense.moe_layers == []


# ---- kunlun_qwen3_next_mtp_names ----------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "n", "moved"),
    [
        ("mtp.layers.0", 48, "mtp.layers.48"),
        ("draft.mtp.layers.2", 4, "draft.mtp.layers.6"),
    ],
)
def test_mtp_layers_are_named_past_the_targets(prefix: str, n: int, moved: str) -> None:
    from vllm_kunlun.models.qwen3_next_mtp import moved_prefix

    assert moved_prefix(prefix, n) == moved


def test_an_unexpected_mtp_prefix_is_named() -> None:
    from vllm_kunlun.models.qwen3_next_mtp import moved_prefix

    with pytest.raises(ValueError, match=r"'mtp\.fc' does not end in \.layers\.<i>"):
        moved_prefix("mtp.fc", 4)


def _mtp_config(**fields: Any) -> Any:
    base = {"num_hidden_layers": 4, "num_experts": 8, "decoder_sparse_step": 1}
    return SimpleNamespace(**{**base, **fields})


@pytest.mark.parametrize(
    ("fields", "changed"),
    [
        ({}, []),  # released configs: every layer sparse
        ({"mlp_only_layers": [1]}, []),  # the e2e test's layout
        ({"mlp_only_layers": [0]}, [0]),  # MTP layer 0 dense in vLLM, sparse as 4
        ({"mlp_only_layers": [4]}, [0]),
        ({"decoder_sparse_step": 2}, []),  # (0+1) % 2, (4+1) % 2: both dense
        ({"decoder_sparse_step": 5}, [0]),  # (0+1) % 5 dense, (4+1) % 5 sparse
        ({"num_experts": 0}, []),
    ],
)
def test_mtp_refused_where_the_moved_index_changes_the_mlp_kind(
    fields: dict[str, Any], changed: list[int]
) -> None:
    from vllm_kunlun.models.qwen3_next_mtp import mlp_kind_changes

    assert mlp_kind_changes(_mtp_config(**fields)) == changed
    config = _config(method="mtp")
    config.model_config.hf_config = SimpleNamespace(
        num_attention_heads=16, linear_num_key_heads=16, **vars(_mtp_config(**fields))
    )
    if changed:
        with pytest.raises(ValueError, match="would get another MLP kind") as err:
            _refuse_unsupported(config)
        assert "without --speculative-config" in str(err.value)
    else:
        _refuse_unsupported(config)


def test_the_mtp_patch_builds_vllms_layer_under_the_moved_name() -> None:
    from vllm.model_executor.models import qwen3_next_mtp as upstream

    from vllm_kunlun.models import qwen3_next_mtp

    (patch,) = qwen3_next_mtp.PATCHES
    assert patch.mismatch() is None  # vLLM 0.15.1 is what it was written for
    built: list[tuple[Any, str, str]] = []

    def layer(vllm_config: Any, layer_type: str, prefix: str = "") -> str:
        built.append((vllm_config, layer_type, prefix))
        return "layer"

    factory = patch.make(layer)
    vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(hf_config=SimpleNamespace(num_hidden_layers=48))
    )
    assert factory(vllm_config, layer_type="full_attention", prefix="mtp.layers.0")
    assert built == [(vllm_config, "full_attention", "mtp.layers.48")]
    assert upstream.Qwen3NextDecoderLayer is not factory  # make() installs nothing
