"""Rotary embedding (RoPE) and multimodal RoPE on the vendor kernels.

Why: vLLM's native rotary path gathers cos/sin, splits, rotates and concatenates (about
a dozen small torch kernels per layer); the vendor library rotates query and key in
place in one call. ``ops/custom_ops/rotary_vendor.py`` calls these wrappers and falls back to
vLLM's native path when one raises ``Refused``.

Assumptions, the same as vLLM's own ``_C.rotary_embedding`` (which upstream's calls
mirror): the kernels rotate ``query`` ([tokens, heads * head_size] or
[tokens, heads, head_size]) and ``key`` in place, take the rotary width from
``cos_sin_cache`` ([max_position, rotary_dim]: cos then sin, in the query dtype), leave
the rest of each head untouched, and index the cache with int64 ``positions``.

The kernels rotate contiguous copies of query and key, never the caller's tensors, and
the rotated copies are returned (vLLM's callers use the returned tensors). Why: when a
kernel raises, ``Route.run`` falls back to vLLM's native path on the same inputs; had
the kernel rotated them in place before raising, the fallback would rotate them a
second time. The copy costs nothing extra when q/k are views into the fused qkv output
(making them contiguous copied them anyway) and one more read and write of q and k when
they are already contiguous (Qwen3's q/k norms return fresh tensors): small next to the
attention that follows. Refusing the fallback instead would turn a kernel error into a
failed request.

Removal: never; this is the vendor seam for rotary embedding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vllm_kunlun.ops.routes import FLOAT_DTYPES, Kernels, Refused


def _prepare(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if key is None:
        raise Refused("no key (cross-layer KV sharing); the kernels rotate both")
    if query.dtype not in FLOAT_DTYPES or key.dtype != query.dtype:
        raise Refused(f"query/key dtypes {query.dtype}/{key.dtype}")
    if cos_sin_cache.dtype != query.dtype:
        raise Refused(
            f"cos_sin_cache dtype {cos_sin_cache.dtype} is not the query's {query.dtype}"
        )
    if positions.dtype != torch.int64:
        raise Refused(f"positions dtype {positions.dtype}, not int64")
    # Copies, also of contiguous inputs: the kernels write them (module docstring).
    copy = torch.contiguous_format
    return (
        positions.contiguous(),
        query.clone(memory_format=copy),
        key.clone(memory_format=copy),
    )


# An M-RoPE layer's section layout: (``mrope_section``, ``mrope_interleaved``).
MRope = tuple[Sequence[int] | None, bool]


def rotary_embedding(
    k: Kernels,
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox_style: bool,
    mrope: MRope | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's ``RotaryEmbedding.forward``, and ``MRotaryEmbedding.forward`` when the
    layer's ``mrope`` layout is given.

    Plain RoPE (any layer's text-only positions, ``[tokens]``):
    ``kunlun_ops.rotary_embedding(positions=, query=, key=, head_size=, cos_sin_cache=,
    is_neox=)`` as upstream calls it. T/H/W positions of an M-RoPE layer
    (``[3, tokens]``) go to ``kunlun_ops.mrotary_embedding_neox(positions, query, key,
    head_size, cos_sin_cache, mrope_section)`` (upstream's positional form), which takes
    section ``i`` of the frequencies from position row ``i`` (the layout of Qwen2-VL's
    M-RoPE). That kernel is neox-style and not interleaved by its name and arguments,
    so the other variants are refused.
    """
    if mrope is None or positions.dim() == 1:
        pos, q, kk = _prepare(positions.flatten(), query, key, cos_sin_cache)
        k["rotary_embedding"](
            positions=pos,
            query=q,
            key=kk,
            head_size=head_size,
            cos_sin_cache=cos_sin_cache,
            is_neox=is_neox_style,
        )
        return q, kk
    mrope_section, mrope_interleaved = mrope
    if positions.dim() != 2 or positions.shape[0] != 3:
        raise Refused(f"positions of shape {tuple(positions.shape)}")
    if not mrope_section:
        raise Refused("[3, tokens] positions without mrope_section")
    if mrope_interleaved:
        raise Refused("interleaved M-RoPE (mrotary_embedding_neox has no such mode)")
    if not is_neox_style:
        raise Refused("GPT-J style M-RoPE (mrotary_embedding_neox is neox-style)")
    pos, q, kk = _prepare(positions, query, key, cos_sin_cache)
    k["mrotary_embedding_neox"](
        pos, q, kk, head_size, cos_sin_cache, [int(s) for s in mrope_section]
    )
    return q, kk
