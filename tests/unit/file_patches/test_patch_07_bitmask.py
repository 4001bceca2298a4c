"""Patch 07's bitmask kernel (plain torch ops, what masks logits on Kunlun) against
xgrammar's own ``apply_token_bitmask_inplace`` on the CPU, the reference: the same
logits come out, over several batch and vocabulary shapes, with and without the row
indices vLLM passes, and with logits wider than the bitmask (vLLM pads the vocabulary).

The function is taken from the patch file itself (its added lines), so the test judges
exactly what ``vllm-kunlun patch apply`` writes into vLLM."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
import xgrammar as xgr

PATCH = (
    Path(__file__).resolve().parents[3]
    / "patches"
    / "vllm-0.15.1-torch-2.5.1"
    / "07-structured-output-bitmask.patch"
)


def patched_function() -> Any:
    added = [
        line[1:]
        for line in PATCH.read_text().splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]
    start = next(
        i for i, s in enumerate(added) if s.startswith("def _apply_token_bitmask")
    )
    source = "\n".join(added[start:])
    namespace: dict[str, Any] = {"torch": torch}
    exec(compile(source, str(PATCH), "exec"), namespace)
    return namespace["_apply_token_bitmask_torch_native"]


def test_the_patch_calls_the_function_it_defines() -> None:
    text = PATCH.read_text()
    assert re.search(r"^-\s+xgr\.apply_token_bitmask_inplace\(", text, re.M)
    assert re.search(r"^\+\s+_apply_token_bitmask_torch_native\(logits", text, re.M)


@pytest.mark.parametrize(
    ("batch", "vocab", "mask_vocab", "rows"),
    [
        (1, 32, 32, None),
        (3, 100, 100, None),  # not a multiple of 32
        (4, 549, 549, [0, 2]),  # the BPE tiny model's vocabulary, two rows masked
        (5, 160, 130, [4, 1, 3]),  # logits wider than the mask: padded vocabulary
        (2, 1000, 1000, [1]),
    ],
)
def test_same_logits_as_xgrammar(
    batch: int, vocab: int, mask_vocab: int, rows: list[int] | None
) -> None:
    gen = torch.Generator().manual_seed(batch * 1000 + vocab)
    logits = torch.randn(batch, vocab, generator=gen)
    allowed = torch.rand(batch, mask_vocab, generator=gen) < 0.3
    bitmask = xgr.testing.bool_mask_to_bitmask(allowed)
    indices = None if rows is None else torch.tensor(rows, dtype=torch.int32)

    expected = logits.clone()
    # vLLM's own call (vllm/v1/structured_output/utils.py), which the patch replaces;
    # xgrammar's CPU kernel takes the row indices as a list (vLLM passes a tensor).
    xgr.apply_token_bitmask_inplace(expected, bitmask, indices=rows)
    got = logits.clone()
    patched_function()(got, bitmask, indices)

    assert torch.equal(got, expected)
    masked = got == float("-inf")
    assert masked.any() and (~masked).any()  # both kinds present: a real comparison
    untouched = [r for r in range(batch) if rows is not None and r not in rows]
    for r in untouched:
        assert torch.equal(got[r], logits[r])
