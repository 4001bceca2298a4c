"""Fake ``torch.ops.xspeedgate_ops`` LoRA kernels: gathered (bgmv) shrink and expand.

``bgmv_shrink_cluster(inputs, lora_a_weights, lora_indices_tensor, output_tensor,
scaling)`` writes ``scaling * inputs[t] @ A[idx[t]]^T`` into ``output_tensor[t]``;
``bgmv_expand_cluster(inputs, lora_b_weights, lora_indices_tensor, output_tensor,
slice_offset)`` adds ``inputs[t] @ B[idx[t]]^T`` into ``output_tensor[t,
slice_offset:slice_offset + N]``. Weights are ``[L, out, in]``. Like a device kernel
that reads the slot as an address, a negative slot is an error here (upstream never
passes one). Computed token by token in float64, independently of the plugin's
portable kernels; calls are recorded in the package's ``CALLS``.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from xspeedgate_ops._int8 import _rec

_SCHEMAS = {
    "bgmv_shrink_cluster": (
        "bgmv_shrink_cluster(Tensor inputs, Tensor lora_a_weights, "
        "Tensor lora_indices_tensor, Tensor(a!) output_tensor, float scaling) -> ()"
    ),
    "bgmv_expand_cluster": (
        "bgmv_expand_cluster(Tensor inputs, Tensor lora_b_weights, "
        "Tensor lora_indices_tensor, Tensor(a!) output_tensor, int slice_offset) -> ()"
    ),
}


def _check(inputs: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> None:
    assert weights.dim() == 3 and weights.is_contiguous(), weights.shape
    assert inputs.shape[0] == idx.shape[0] and inputs.shape[1] == weights.shape[2]
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= weights.shape[0]):
        raise IndexError(f"LoRA slot out of range: {idx.tolist()}")


def bgmv_shrink_cluster(
    inputs, lora_a_weights, lora_indices_tensor, output_tensor, scaling
):
    _check(inputs, lora_a_weights, lora_indices_tensor)
    _rec("bgmv_shrink_cluster", indices=lora_indices_tensor, scaling=scaling)
    for t, slot in enumerate(lora_indices_tensor.tolist()):
        row = inputs[t].double() @ lora_a_weights[slot].double().t()
        output_tensor[t].copy_((scaling * row).to(output_tensor.dtype))


def bgmv_expand_cluster(
    inputs, lora_b_weights, lora_indices_tensor, output_tensor, slice_offset
):
    _check(inputs, lora_b_weights, lora_indices_tensor)
    _rec("bgmv_expand_cluster", indices=lora_indices_tensor, slice_offset=slice_offset)
    n = lora_b_weights.shape[1]
    for t, slot in enumerate(lora_indices_tensor.tolist()):
        row = inputs[t].double() @ lora_b_weights[slot].double().t()
        target = output_tensor[t, slice_offset : slice_offset + n]
        target.copy_((target.double() + row).to(output_tensor.dtype))


def _dispatch(name: str):
    def call(*args: Any) -> None:
        getattr(sys.modules[__name__], name)(*args)

    return call


if not hasattr(torch.ops.xspeedgate_ops, "bgmv_shrink_cluster"):
    _LIB = torch.library.Library("xspeedgate_ops", "FRAGMENT")
    for _name, _schema in _SCHEMAS.items():
        _LIB.define(_schema)
        _LIB.impl(_name, _dispatch(_name), "CompositeExplicitAutograd")
