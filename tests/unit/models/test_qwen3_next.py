"""The plugin's Qwen3-Next refuses at start what it does not serve, naming the fix."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from vllm_kunlun.models.qwen3_next import _refuse_unsupported


def _config(tp: int = 1, method: str | None = None, **fields: Any) -> Any:
    hf = SimpleNamespace(
        **{"num_attention_heads": 16, "linear_num_key_heads": 16, **fields}
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
