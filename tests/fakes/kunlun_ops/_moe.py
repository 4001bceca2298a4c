"""Fake ``moe_ffn_block``: the whole routed MoE block, as the plugin calls it.

Semantics implemented (transformers 5.2.0's ``Qwen3_5MoeTopKRouter`` and
``Qwen3_5MoeExperts``; observed usage pins the keywords, not the real kernel's
semantics, which hardware must confirm): router logits ``x @ gate_w.T`` in ``x``'s
dtype, softmax in float32, ``torch.topk(moe_top_k)``, renormalised when
``renormalize``; each (token, slot) pair runs its expert ``silu(gate) * up`` with
``gate, up = (inter_w[e] @ x).chunk(2)`` and ``output_w[e] @ h``, weighted, summed in
float64 and written into ``out`` in ``x``'s dtype. Written as a plain loop over tokens
and slots, independently of the plugin's grouped kernel, so a test comparing the two
compares two implementations. Grouped top-k is not modelled (it raises). Inputs are
checked like a device kernel's (contiguity, dtypes, shapes); every call is recorded.
"""

from __future__ import annotations

import torch

from kunlun_ops._kernel_common import (
    FLOATS,
    check_same,
    check_tensor,
    fail,
    record,
    unmodeled,
)

__all__ = ["moe_ffn_block"]


def moe_ffn_block(
    x,
    gate_w,
    inter_w,
    output_w,
    expert_num,
    moe_top_k,
    topk_group=0,
    renormalize=True,
    use_grouped_topk=False,
    expert_group_num=0,
    out=None,
):
    name = "moe_ffn_block"
    record(
        name,
        x=x,
        gate_w=gate_w,
        inter_w=inter_w,
        output_w=output_w,
        expert_num=expert_num,
        moe_top_k=moe_top_k,
        topk_group=topk_group,
        renormalize=renormalize,
        use_grouped_topk=use_grouped_topk,
        expert_group_num=expert_group_num,
        out=out,
    )
    unmodeled(
        name,
        use_grouped_topk=(use_grouped_topk, False),
        topk_group=(topk_group, 0),
        expert_group_num=(expert_group_num, 0),
    )
    check_tensor(name, "x", x, dtypes=FLOATS, dim=2)
    check_tensor(name, "gate_w", gate_w, dim=2)
    check_tensor(name, "inter_w", inter_w, dim=3)
    check_tensor(name, "output_w", output_w, dim=3)
    check_same(name, "x", x, gate_w=gate_w, inter_w=inter_w, output_w=output_w)
    if out is None:
        fail(name, "out is required")
    check_same(name, "x", x, out=out)
    tokens, hidden = x.shape
    inter = output_w.shape[2]
    if gate_w.shape != (expert_num, hidden):
        fail(name, f"gate_w {tuple(gate_w.shape)} for {expert_num} experts x {hidden}")
    if inter_w.shape != (expert_num, 2 * inter, hidden):
        fail(
            name,
            f"inter_w {tuple(inter_w.shape)}, want {(expert_num, 2 * inter, hidden)}",
        )
    if output_w.shape != (expert_num, hidden, inter):
        fail(
            name,
            f"output_w {tuple(output_w.shape)}, want {(expert_num, hidden, inter)}",
        )
    if out.shape != x.shape:
        fail(name, f"out {tuple(out.shape)} for x {tuple(x.shape)}")
    if not 0 < moe_top_k <= expert_num:
        fail(name, f"moe_top_k={moe_top_k} with {expert_num} experts")
    probs = torch.softmax(x @ gate_w.t(), dim=-1, dtype=torch.float32)
    top_w, top_i = torch.topk(probs, moe_top_k, dim=-1)
    if renormalize:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    acc = torch.zeros(tokens, hidden, dtype=torch.float64, device=x.device)
    for t in range(tokens):
        xt = x[t].double()
        for j in range(moe_top_k):
            e = int(top_i[t, j])
            gate, up = (inter_w[e].double() @ xt).chunk(2)
            h = gate * torch.sigmoid(gate) * up
            acc[t] += float(top_w[t, j]) * (output_w[e].double() @ h)
    out.copy_(acc.to(out.dtype))
