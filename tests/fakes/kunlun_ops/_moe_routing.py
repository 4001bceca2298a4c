"""Fake MoE routing kernels: ``moe_softmax_topk_norm`` and ``moe_sigmoid_group_topk_norm``.

Semantics implemented (vLLM 0.15.1's routers, which the plugin's FusedMoE method must
reproduce; observed usage pins the keywords, not the real kernels' semantics, which
hardware must confirm): written per token as plain loops over the experts and groups,
independently of ``vllm_kunlun/ops/moe/routing.py``, so a test comparing the two
compares two implementations.

- ``moe_softmax_topk_norm``: softmax of the logits in float32, the ``k`` largest
  (``k`` = the outputs' width), renormalised to sum to 1;
- ``moe_sigmoid_group_topk_norm``: sigmoid scores; choice scores = scores + ``bias``;
  each of ``n_group`` contiguous groups ranked by the sum of its two best choice scores,
  the ``topk_group`` best groups kept, the ``k`` best choice scores inside them chosen;
  weights = the unbiased scores of the chosen, renormalised, times ``scale``.

Outputs are written in place (float32 weights, int32 ids); ``block_statistic`` /
``block_static`` must be None (the per-block counts are not modelled). Inputs are
checked like a device kernel's; every call is recorded.
"""

from __future__ import annotations

import torch

from kunlun_ops._kernel_common import check_tensor, fail, record

__all__ = ["moe_sigmoid_group_topk_norm", "moe_softmax_topk_norm"]


def _check_outputs(name, x, weights, ids):
    check_tensor(name, "x", x, dtypes=(torch.float32,), dim=2)
    check_tensor(
        name, "scores", weights, dtypes=(torch.float32,), dim=2, device=x.device
    )
    check_tensor(name, "topk_index", ids, dtypes=(torch.int32,), dim=2, device=x.device)
    if weights.shape != ids.shape or weights.shape[0] != x.shape[0]:
        fail(
            name,
            f"outputs {tuple(weights.shape)} / {tuple(ids.shape)} for x {tuple(x.shape)}",
        )
    if not 0 < ids.shape[1] <= x.shape[1]:
        fail(name, f"top-k {ids.shape[1]} of {x.shape[1]} experts")


def _best(values, candidates, k):
    """The ``k`` candidates with the largest values, largest first (lower id on ties)."""
    return sorted(candidates, key=lambda e: (-values[e], e))[:k]


def moe_softmax_topk_norm(
    x, normed_score, topk_index, block_statistic=None, stable=False
):
    name = "moe_softmax_topk_norm"
    record(
        name,
        x=x,
        normed_score=normed_score,
        topk_index=topk_index,
        block_statistic=block_statistic,
        stable=stable,
    )
    if block_statistic is not None:
        fail(name, "block_statistic is not modelled by the fake (pass None)")
    _check_outputs(name, x, normed_score, topk_index)
    k = topk_index.shape[1]
    for t in range(x.shape[0]):
        row = x[t].double()
        p = torch.exp(row - row.max())
        p = (p / p.sum()).tolist()
        chosen = _best(p, range(len(p)), k)
        total = sum(p[e] for e in chosen)
        for j, e in enumerate(chosen):
            topk_index[t, j] = e
            normed_score[t, j] = p[e] / total


def moe_sigmoid_group_topk_norm(
    x,
    norm_score,
    topk_index,
    block_static=None,
    bias=None,
    scale=1.0,
    n_group=1,
    topk_group=1,
):
    name = "moe_sigmoid_group_topk_norm"
    record(
        name,
        x=x,
        norm_score=norm_score,
        topk_index=topk_index,
        block_static=block_static,
        bias=bias,
        scale=scale,
        n_group=n_group,
        topk_group=topk_group,
    )
    if block_static is not None:
        fail(name, "block_static is not modelled by the fake (pass None)")
    _check_outputs(name, x, norm_score, topk_index)
    experts = x.shape[1]
    check_tensor(name, "bias", bias, dtypes=(torch.float32,), dim=1, device=x.device)
    if bias.shape[0] != experts or experts % n_group or not 0 < topk_group <= n_group:
        fail(
            name,
            f"bias {tuple(bias.shape)}, n_group={n_group}, topk_group={topk_group} for {experts} experts",
        )
    per = experts // n_group
    k = topk_index.shape[1]
    b = bias.double().tolist()
    for t in range(x.shape[0]):
        s = torch.sigmoid(x[t].double()).tolist()
        c = [s[e] + b[e] for e in range(experts)]
        group_score = []
        for g in range(n_group):
            members = sorted(
                (c[e] for e in range(g * per, (g + 1) * per)), reverse=True
            )
            group_score.append(sum(members[:2]))
        groups = _best(group_score, range(n_group), topk_group)
        candidates = [e for g in groups for e in range(g * per, (g + 1) * per)]
        chosen = _best(c, candidates, k)
        total = sum(s[e] for e in chosen)
        for j, e in enumerate(chosen):
            topk_index[t, j] = e
            norm_score[t, j] = scale * s[e] / total
