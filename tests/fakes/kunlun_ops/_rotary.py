"""Fake rotary kernels: rotary_embedding and mrotary_embedding_neox.

Semantics of vLLM's own ``_C.rotary_embedding``, which upstream's calls mirror (see
vllm_kunlun/ops/custom_ops/rotary_vendor.py): query/key rotated in place, the rotary width taken from
``cos_sin_cache`` ([positions, rotary_dim]: cos then sin), the rest of each head left
alone, int64 positions. M-RoPE takes frequency section ``i`` from position row ``i``.
"""

from __future__ import annotations

from typing import Any

import torch

from kunlun_ops._kernel_common import FLOATS, check_same, check_tensor, fail, record

__all__ = ["mrotary_embedding_neox", "rotary_embedding"]


def _check(
    kernel: str,
    positions: Any,
    query: Any,
    key: Any,
    head_size: int,
    cache: Any,
    pos_dim: int,
) -> int:
    check_tensor(kernel, "query", query, dtypes=FLOATS)
    check_same(kernel, "query", query, key=key, cos_sin_cache=cache)
    check_tensor(
        kernel,
        "positions",
        positions,
        dtypes=(torch.int64,),
        dim=pos_dim,
        device=query.device,
    )
    tokens = positions.shape[-1]
    for name, t in (("query", query), ("key", key)):
        if t.shape[0] != tokens or t.numel() % (tokens * head_size):
            fail(
                kernel, f"{name} {tuple(t.shape)} is no [{tokens}, heads * {head_size}]"
            )
    rot = cache.shape[-1] if cache.dim() == 2 else -1
    if rot <= 0 or rot % 2 or rot > head_size:
        fail(kernel, f"cos_sin_cache {tuple(cache.shape)} for head_size {head_size}")
    if bool((positions < 0).any()) or bool((positions >= cache.shape[0]).any()):
        fail(kernel, "position outside cos_sin_cache")
    return rot


def _rotate(
    t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int, neox: bool
) -> None:
    heads = t.view(t.shape[0], -1, head_size)
    rot = cos.shape[-1] * 2
    x = heads[..., :rot].float()
    c, s = cos[:, None, :].float(), sin[:, None, :].float()
    if neox:
        x1, x2 = x[..., : rot // 2], x[..., rot // 2 :]
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    else:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    heads[..., :rot] = out.to(t.dtype)


def rotary_embedding(*, positions, query, key, head_size, cos_sin_cache, is_neox):
    name = "rotary_embedding"
    record(
        name,
        positions=positions,
        query=query,
        key=key,
        head_size=head_size,
        cos_sin_cache=cos_sin_cache,
        is_neox=is_neox,
    )
    rot = _check(name, positions, query, key, head_size, cos_sin_cache, 1)
    cos, sin = cos_sin_cache[positions].split(rot // 2, dim=-1)
    _rotate(query, cos, sin, head_size, is_neox)
    _rotate(key, cos, sin, head_size, is_neox)


def mrotary_embedding_neox(
    positions, query, key, head_size, cos_sin_cache, mrope_section, /
):
    name = "mrotary_embedding_neox"
    record(
        name,
        positions=positions,
        query=query,
        key=key,
        head_size=head_size,
        cos_sin_cache=cos_sin_cache,
        mrope_section=mrope_section,
    )
    rot = _check(name, positions, query, key, head_size, cos_sin_cache, 2)
    if (
        positions.shape[0] != 3
        or len(mrope_section) != 3
        or sum(mrope_section) != rot // 2
    ):
        fail(
            name,
            f"positions {tuple(positions.shape)}, sections {mrope_section} for rotary_dim {rot}",
        )
    cos, sin = cos_sin_cache[positions].split(rot // 2, dim=-1)  # [3, tokens, rot/2]

    def pick(t: torch.Tensor) -> torch.Tensor:
        parts = t.split(list(mrope_section), dim=-1)
        return torch.cat([part[i] for i, part in enumerate(parts)], dim=-1)

    _rotate(query, pick(cos), pick(sin), head_size, True)
    _rotate(key, pick(cos), pick(sin), head_size, True)
