"""The comparison on synthetic logprob tables whose answers are known: agreement, gaps,
the verdict at its thresholds, a tokenization mismatch."""

from __future__ import annotations

import itertools
import math

import pytest

from vllm_kunlun.accuracy.compare import (
    THRESHOLDS,
    PromptResult,
    TokenizationMismatch,
    compare_prompt,
    judge,
    report,
    thresholds_for,
)
from vllm_kunlun.accuracy.endpoint import ServerPosition, ServerPrompt
from vllm_kunlun.accuracy.reference import ReferencePrompt

IDS = [1, 5, 6, 7, 8]


def server(logprobs: list[float], top1: list[int]) -> ServerPrompt:
    return ServerPrompt(
        IDS,
        [
            ServerPosition(lp, 1 if t == IDS[i + 1] else 2, t, max(lp, -0.1))
            for i, (lp, t) in enumerate(zip(logprobs, top1, strict=True))
        ],
    )


def ref(logprobs: list[float], argmax: list[int]) -> ReferencePrompt:
    return ReferencePrompt(
        logprob=logprobs,
        argmax=argmax,
        argmax_logprob=[-0.1] * len(argmax),
        at_server_top1=[-0.3] * len(argmax),
    )


def test_agreement_and_gaps_are_what_the_tables_say() -> None:
    s = server([-1.0, -2.0, -3.0, -4.0], [5, 6, 40, 8])
    r = ref([-1.0, -2.5, -3.1, -4.0], [5, 6, 7, 9])
    res = compare_prompt("p", s, IDS, r)
    assert res.agreement == 0.5  # positions 3 and 4 differ
    assert res.max_gap == pytest.approx(0.5)
    assert res.mean_gap == pytest.approx(0.6 / 4)
    assert (res.worst_position, res.worst_token) == (2, 6)
    assert (res.server_logprob, res.reference_logprob) == (-2.0, -2.5)
    assert [d["position"] for d in res.disagreements] == [3, 4]
    assert res.disagreements[0]["reference_margin"] == pytest.approx(0.2)


def test_identical_numbers_agree_exactly() -> None:
    lps = [-1.0, -2.0, -3.0, -4.0]
    res = compare_prompt("p", server(lps, IDS[1:]), IDS, ref(lps, IDS[1:]))
    assert (res.agreement, res.max_gap, res.mean_gap) == (1.0, 0.0, 0.0)


def test_tokenization_mismatch_names_the_position() -> None:
    s = server([-1.0] * 4, IDS[1:])
    with pytest.raises(TokenizationMismatch, match=r"at position 2.*another tokenizer"):
        compare_prompt("p", s, [1, 5, 9, 7, 8], ref([-1.0] * 4, IDS[1:]))
    with pytest.raises(TokenizationMismatch, match="5 vs 4 tokens"):
        compare_prompt("p", s, IDS[:4], ref([-1.0] * 3, IDS[1:4]))


def result(agreement: float, max_gap: float, mean_gap: float) -> PromptResult:
    return PromptResult("p", 101, 100, agreement, max_gap, mean_gap, 3, 9, -1.0, -1.1)


@pytest.mark.parametrize("precision", list(THRESHOLDS))
def test_the_verdict_holds_at_each_threshold_and_fails_just_past_it(
    precision: str,
) -> None:
    th = THRESHOLDS[precision]
    edge = result(th.min_agreement, th.max_gap, th.max_mean_gap)
    assert judge([edge], precision, th).passed
    for bad, word in [
        (result(th.min_agreement - 0.01, th.max_gap, th.max_mean_gap), "agreement"),
        (result(th.min_agreement, th.max_gap * 1.01, th.max_mean_gap), "largest"),
        (result(th.min_agreement, th.max_gap, th.max_mean_gap * 1.01), "mean"),
    ]:
        v = judge([bad], precision, th)
        assert not v.passed and len(v.failures) == 1 and word in v.failures[0]


def test_aggregates_weigh_positions_and_name_the_worst_prompt() -> None:
    th = THRESHOLDS["float32"]
    a = PromptResult("short", 3, 2, 0.5, 1e-4, 1e-4, 1, 5, -1.0, -1.0)
    b = PromptResult("long", 99, 98, 1.0, 0.2, 1e-3, 7, 9, -2.0, -2.2)
    v = judge([a, b], "float32", th)
    assert v.agreement == pytest.approx((1 + 98) / 100)
    assert v.worst_prompt == "long" and v.max_gap == 0.2
    assert any("'long' position 7" in f for f in v.failures)


def test_an_infinite_gap_fails_and_is_valid_json() -> None:
    import json

    s = server([-math.inf, -1.0, -1.0, -1.0], IDS[1:])
    res = compare_prompt("p", s, IDS, ref([-2.0, -1.0, -1.0, -1.0], IDS[1:]))
    assert math.isinf(res.max_gap)
    v = judge([res], "float32", THRESHOLDS["float32"])
    assert not v.passed
    doc = json.loads(json.dumps(report(v, [res]), allow_nan=False))
    assert doc["max_gap"] == "inf" and doc["passed"] is False


def test_w8a8_thresholds_are_the_loosest_and_fp32_the_tightest() -> None:
    assert thresholds_for("bfloat16", "w8a8")[0] == "w8a8"
    assert thresholds_for("float16", "none") == ("float16", THRESHOLDS["float16"])
    order = ["float32", "float16", "bfloat16", "w8a8"]
    for tighter, looser in itertools.pairwise(order):
        t, lo = THRESHOLDS[tighter], THRESHOLDS[looser]
        assert t.max_gap < lo.max_gap and t.max_mean_gap < lo.max_mean_gap
        assert t.min_agreement > lo.min_agreement
