"""The fake kunlun_ops' sampling functions sample with flashinfer's semantics.

The vendor-path tests (the seam, vLLM's sampler, the engine end to end) are only as good
as this fake: one that answered greedily would let a sampler that discards the kernel's
draw pass. Checked here against the float64 reference of tests/unit/sampler_reference.py:
the kept set of top-k / top-p in both filter orders, ``indices`` mapping output rows to
score rows with per-output-row parameters, the generator or the global RNG, the records
(in-process and the JSON lines other processes leave), and the input checks.
Goodness of fit: Pearson's chi-square, failing at p < ALPHA with fixed seeds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.unit.sampler_reference import ALPHA, chi_square_pvalue, reference

N = 6000  # draws per distribution
VOCAB = 111


@pytest.fixture
def ops(fake_vendor_path: Path) -> Any:
    import kunlun_ops

    kunlun_ops.reset()
    return kunlun_ops


def two_rows(seed: int) -> torch.Tensor:
    """Two distributions of VOCAB tokens, one peaked and one flat, as logits."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, VOCAB, generator=g) * torch.tensor([[3.0], [0.7]])


def fits(
    tokens: torch.Tensor,
    logits: torch.Tensor,
    k: int | None,
    p: float | None,
    joint: bool = False,
) -> None:
    pvalue = chi_square_pvalue(tokens.long().numpy(), reference(logits, k, p, joint))
    assert pvalue > ALPHA, (k, p, joint, pvalue)


def spread(n: int, first: Any, second: Any, dtype: torch.dtype) -> torch.Tensor:
    """One parameter per output row: ``first`` for rows 0..n-1, ``second`` after."""
    return torch.tensor([first] * n + [second] * n, dtype=dtype)


# Output rows 0..N-1 draw from score row 1, the next N from row 0: indices, not order.
INDICES = torch.tensor([1] * N + [0] * N, dtype=torch.int32)


@pytest.mark.parametrize("order", ["top_k_first", "joint"])
def test_top_k_top_p_from_probs_keeps_flashinfers_set_per_output_row(
    ops: Any, order: str
) -> None:
    logits = two_rows(1)
    probs = logits.softmax(-1)
    k = spread(N, 20, 6, torch.int32)
    p = spread(N, 0.5, 0.9, torch.float32)
    torch.manual_seed(2)
    tokens = ops.top_k_top_p_sampling_from_probs(
        probs, k, p, indices=INDICES, filter_apply_order=order
    )
    assert tokens.shape == (2 * N,) and tokens.dtype == torch.int32  # indices' dtype
    joint = order == "joint"
    fits(tokens[:N], logits[1], 20, 0.5, joint)
    fits(tokens[N:], logits[0], 6, 0.9, joint)


def test_the_two_filter_orders_differ_where_flashinfer_says(ops: Any) -> None:
    """top_k_first takes top-p of the renormalised top-k mass, joint of the whole: with
    a flat row, k = 10 and p = 0.5, top_k_first keeps about 5 tokens, joint all 10."""
    flat = torch.zeros(1, VOCAB)
    flat[0, :10] = torch.linspace(1.0, 0.9, 10)
    probs = flat.softmax(-1)
    rows = torch.zeros(N, dtype=torch.int64)
    kept = {}
    for order in ("top_k_first", "joint"):
        tokens = ops.top_k_top_p_sampling_from_probs(
            probs, 10, 0.5, indices=rows, filter_apply_order=order
        )
        assert tokens.dtype == torch.int64
        kept[order] = set(tokens.tolist())
    assert kept["top_k_first"] == set(range(5))
    assert kept["joint"] == set(range(10))


def test_top_k_and_top_p_alone_and_unfiltered(ops: Any) -> None:
    logits = two_rows(3)
    probs = logits.softmax(-1)
    torch.manual_seed(4)
    fits(
        ops.top_k_sampling_from_probs(probs, 7, indices=INDICES)[:N], logits[1], 7, None
    )
    got = ops.top_p_sampling_from_probs(
        probs, spread(N, 0.3, 0.8, torch.float32), INDICES
    )
    fits(got[:N], logits[1], None, 0.3)
    fits(got[N:], logits[0], None, 0.8)
    got = ops.sampling_from_probs(probs, indices=INDICES)
    fits(got[:N], logits[1], None, None)
    fits(got[N:], logits[0], None, None)
    # k >= vocab and p >= 1 filter nothing; top_k 0 is "no top-k" too.
    got = ops.top_k_top_p_sampling_from_probs(probs, 0, 1.0, indices=INDICES)
    fits(got[N:], logits[0], None, None)


@pytest.mark.parametrize("order", ["top_k_first", "joint"])
def test_from_logits_samples_their_softmax(ops: Any, order: str) -> None:
    logits = two_rows(5)
    torch.manual_seed(6)
    tokens = ops.top_k_top_p_sampling_from_logits(
        logits, 12, 0.7, indices=INDICES.long(), filter_apply_order=order
    )
    fits(tokens[:N], logits[1], 12, 0.7, order == "joint")
    fits(tokens[N:], logits[0], 12, 0.7, order == "joint")


def test_without_indices_row_i_is_drawn_from_row_i(ops: Any) -> None:
    logits = two_rows(7).repeat_interleave(N, dim=0)  # rows 0..N-1 peaked, then flat
    k = spread(N, 4, 30, torch.int32)
    torch.manual_seed(8)
    tokens = ops.top_k_top_p_sampling_from_probs(
        logits.softmax(-1), k, torch.ones(2 * N)
    )
    assert tokens.dtype == torch.int32
    fits(tokens[:N], logits[0], 4, None)
    fits(tokens[N:], logits[N], 30, None)


def test_draws_come_from_the_generator_or_the_global_rng(ops: Any) -> None:
    probs = torch.zeros(64, VOCAB).softmax(-1)  # uniform: draws differ between seeds

    def draw(generator: torch.Generator | None = None) -> list[int]:
        return ops.sampling_from_probs(probs, generator=generator).tolist()

    def gen(seed: int) -> torch.Generator:
        return torch.Generator().manual_seed(seed)

    assert draw(gen(1)) == draw(gen(1)) != draw(gen(2))
    torch.manual_seed(3)
    first = draw()
    torch.manual_seed(3)
    assert draw() == first != draw()
    torch.manual_seed(3)
    draw(gen(9))  # a generator leaves the global RNG alone
    assert draw() == first


def test_calls_are_recorded_with_their_output_here_and_in_the_file(
    ops: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_KUNLUN_OPS_RECORD", str(path))
    probs = torch.randn(3, VOCAB).softmax(-1)
    k = torch.tensor([1, 5, VOCAB], dtype=torch.int32)
    p = torch.tensor([1.0, 0.5, 0.9])
    tokens = ops.top_k_top_p_sampling_from_probs(probs, top_k=k, top_p=p)
    (call,) = ops.CALLS
    assert call.name == "top_k_top_p_sampling_from_probs"
    assert torch.equal(call.out, tokens) and torch.equal(call.tensors["top_k"], k)
    assert tokens[0] == probs[0].argmax()  # k = 1
    (line,) = path.read_text().splitlines()
    entry = json.loads(line)
    assert entry["name"] == call.name and entry["out"] == tokens.tolist()
    assert entry["args"]["top_k"]["values"] == k.tolist()
    assert np.allclose(entry["args"]["top_p"]["values"], p.tolist())
    assert entry["args"]["probs"]["shape"] == [3, VOCAB]
    assert "values" not in entry["args"]["probs"]  # rows are described, not dumped
    assert entry["args"]["filter_apply_order"] == "top_k_first"


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda o, pr: o.top_k_sampling_from_probs(pr, torch.ones(4)), "top_k must be"),
        (lambda o, pr: o.top_p_sampling_from_probs(pr, torch.ones(3)), "top_p must be"),
        (
            lambda o, pr: o.top_k_sampling_from_probs(pr, 3, indices=torch.tensor([4])),
            "indices outside",
        ),
        (
            lambda o, pr: o.top_k_top_p_sampling_from_probs(
                pr, 3, 0.5, filter_apply_order="top_p_first"
            ),
            "filter_apply_order",
        ),
        (lambda o, pr: o.sampling_from_probs(pr.double()), "float32"),
        (lambda o, pr: o.sampling_from_probs(pr.t()), "contiguous"),
        (lambda o, pr: o.sampling_from_probs(pr * float("nan")), "contains NaN"),
        (lambda o, pr: o.sampling_from_probs(pr * 0), "no probability mass"),
    ],
)
def test_bad_inputs_raise_like_the_kernel(ops: Any, call: Any, error: str) -> None:
    probs = torch.randn(4, 4).softmax(-1)
    with pytest.raises((ValueError, TypeError), match=error):
        call(ops, probs)
    assert ops.CALLS == []
