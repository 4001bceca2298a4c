"""``VLLM_PP_LAYER_PARTITION`` checked against the model and the stages before vLLM
builds a stage: the values vLLM 0.15.1 lets through to a loader error (``-1,5``) or an
assertion (``0,4``) are refused naming the value and a valid partition."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_kunlun.checks.pp_partition import even_split, pp_partition_problem
from vllm_kunlun.guards.engine_checks import PipelinePartitionError, pp_partition_guard


@pytest.mark.parametrize(
    ("raw", "pp", "layers", "words"),
    [
        ("-1,5", 2, 4, "gives stage 0 -1 layer(s)"),
        ("0,4", 2, 4, "gives stage 0 0 layer(s)"),
        ("2,2,2", 2, 6, "names 3 stage(s)"),
        ("2,3", 2, 4, "adds up to 5 layers; the model has 4"),
        ("2;2", 2, 4, "not a list of whole numbers"),
        ("", 2, 4, "not a list of whole numbers"),
        ("1,1,1", 3, 2, "fewer than the 3 pipeline stages"),
    ],
)
def test_bad_partitions_are_named_with_a_valid_one(
    raw: str, pp: int, layers: int, words: str
) -> None:
    problem = pp_partition_problem(raw, pp, layers)
    assert problem is not None and words in problem
    if layers >= pp:
        assert f"VLLM_PP_LAYER_PARTITION={even_split(layers, pp)}" in problem


@pytest.mark.parametrize(
    ("raw", "pp", "layers"),
    [(None, 2, 4), ("1,3", 2, 4), ("2, 2", 2, 4), ("3,3,2", 3, 8)],
)
def test_usable_partitions_pass(raw: str | None, pp: int, layers: int) -> None:
    assert pp_partition_problem(raw, pp, layers) is None


@pytest.mark.parametrize(("layers", "pp"), [(4, 2), (7, 3), (48, 8), (3, 3)])
def test_the_suggested_split_is_itself_valid(layers: int, pp: int) -> None:
    suggestion = even_split(layers, pp)
    assert pp_partition_problem(suggestion, pp, layers) is None


def _config(pp: int, layers: int) -> SimpleNamespace:
    return SimpleNamespace(
        parallel_config=SimpleNamespace(pipeline_parallel_size=pp),
        model_config=SimpleNamespace(get_total_num_hidden_layers=lambda: layers),
    )


def test_the_engine_guard_reads_vllms_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "-1,5")
    with pytest.raises(PipelinePartitionError, match=r"stage 0 -1 layer"):
        pp_partition_guard(_config(2, 4))
    pp_partition_guard(_config(1, 4))  # no pipeline: the variable is not read
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "1,3")
    pp_partition_guard(_config(2, 4))
