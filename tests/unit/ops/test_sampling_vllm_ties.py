"""``apply_top_k_top_p`` against vLLM 0.15.1's own at ties on the top-p boundary.

vLLM sorts the row (not stably) and masks by position in the cumulative sum: of a tie
group straddling the boundary it keeps as many tokens as its walk needs, and which of
them depends on its sort. Where vLLM's answer is deterministic (the number of tokens,
every token above the boundary value) ours must equal it; kept ties are tokens of the
boundary group. Rows whose walk stops within float rounding of ``p`` are left out (both
float32 implementations may round either way there).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vllm.platforms import current_platform  # noqa: F401  (resolves the platform)
from vllm.v1.sample.ops import topk_topp_sampler as upstream

from vllm_kunlun.ops.sampling import threshold
from vllm_kunlun.ops.sampling.topk_topp import apply_top_k_top_p

NEG = float("-inf")


def _walk(row: torch.Tensor, k: int | None, p: float) -> tuple[int, float]:
    """vLLM's count in float64 (descending walk) and the margin of its stop to p."""
    x = row.double()
    if k is not None and k < x.shape[0]:
        x = torch.where(x >= x.sort(descending=True).values[k - 1], x, NEG)
    q = torch.softmax(x, 0).sort(descending=True).values.numpy()
    before = np.concatenate([[0.0], np.cumsum(q)[:-1]])
    kept = max(1, int((before < p).sum()))
    return kept, float(np.abs(before[q > 0] - p).min())


def _compare(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor
) -> tuple[int, int]:
    """Asserts ours against vLLM row by row; returns (rows compared, rows cut)."""
    ours = apply_top_k_top_p(logits.clone(), k, p)
    theirs = upstream.apply_top_k_top_p(logits.clone(), k, p)
    compared = cut = 0
    for i in range(logits.shape[0]):
        ki = None if k is None else int(k[i])
        pi = float(p[i]) if p.numel() > 1 else float(p[0])
        count, margin = _walk(logits[i], ki, pi)
        if margin < 1e-5:
            continue
        mine, vllm = ours[i] > NEG, theirs[i] > NEG
        assert int(vllm.sum()) == count, "the float64 walk disagrees with vLLM"
        assert int(mine.sum()) == count, (i, ki, pi, int(mine.sum()), count)
        boundary = float(logits[i][vllm].min())
        above = logits[i] > boundary
        assert torch.equal(mine & above, vllm & above)
        assert bool((logits[i][mine & ~above] == boundary).all())
        assert torch.equal(ours[i][mine], logits[i][mine])  # kept logits untouched
        compared += 1
        cut += int((logits[i] == boundary).sum()) > int((mine & ~above).sum())
    return compared, cut


def test_ten_heavy_tokens_and_290_tied_keep_vllms_46() -> None:
    logits = torch.zeros(1, 300)
    logits[0, :10] = 2.0
    p = torch.tensor([0.3])
    ours = apply_top_k_top_p(logits.clone(), None, p)
    theirs = upstream.apply_top_k_top_p(logits.clone(), None, p)
    assert int(torch.isfinite(theirs).sum()) == 46
    assert int(torch.isfinite(ours).sum()) == 46
    assert bool(torch.isfinite(ours[0, :10]).all())
    # The ties kept are the lowest-indexed of the group: deterministic.
    assert torch.isfinite(ours[0]).nonzero().view(-1).tolist() == list(range(46))
    assert _compare(logits, None, p) == (1, 1)


@pytest.mark.parametrize(
    "batch,vocab", [(1, 50), (7, 600), (16, 5000), (3, 40000), (64, 300)]
)
@pytest.mark.parametrize("with_k", [False, True])
def test_random_rows_with_ties_keep_vllms_count(
    batch: int, vocab: int, with_k: bool
) -> None:
    """Logits rounded to a coarse grid (as bf16 logits are) tie by the hundreds."""
    g = torch.Generator().manual_seed(batch * 1000 + vocab + with_k)
    scale = torch.rand(batch, 1, generator=g) * 3 + 0.5
    step = torch.tensor([0.25, 0.5, 1.0])[torch.randint(0, 3, (batch, 1), generator=g)]
    logits = (torch.randn(batch, vocab, generator=g) * scale / step).round() * step
    p = torch.rand(batch, generator=g) * 0.9 + 0.05
    k = torch.randint(1, vocab + 1, (batch,), generator=g) if with_k else None
    compared, cut = _compare(logits, k, p)
    assert compared >= max(1, batch // 2)
    if not with_k:  # top-k may bind before top-p; without it ties are cut somewhere
        assert cut >= 1


def test_a_single_p_for_every_row() -> None:
    g = torch.Generator().manual_seed(9)
    logits = (torch.randn(8, 400, generator=g) * 2).round()
    compared, cut = _compare(logits, None, torch.tensor([0.5]))
    assert compared >= 4 and cut >= 1


def test_the_device_path_cuts_the_same_ties(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without host reads (every row through the cut) the same logits come out."""
    g = torch.Generator().manual_seed(10)
    logits = (torch.randn(12, 700, generator=g) * 2).round()
    k = torch.tensor([700, 30, 700, 5, 200, 700, 700, 1, 50, 700, 700, 600])
    p = torch.tensor([0.3, 0.9, 1.0, 0.5, 0.7, 0.2, 0.95, 0.5, 0.99, 1.0, 0.6, 0.4])
    host = apply_top_k_top_p(logits.clone(), k, p)
    monkeypatch.setattr(threshold, "on_host", lambda t: False)
    device = apply_top_k_top_p(logits.clone(), k, p)
    monkeypatch.undo()
    assert torch.equal(host, device)
    compared, cut = _compare(logits, k, p)
    assert compared >= 6 and cut >= 1
