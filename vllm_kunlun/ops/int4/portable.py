"""Portable weight-only quantized linear (W4A16 / W8A16): unpack, dequantize per group,
multiply, in plain torch and in chunks of the input dimension.

Why: vLLM 0.15.1 serves weight-only integer checkpoints (compressed-tensors
``pack-quantized``) only through CUDA / CPU kernels of ``vllm._C``, which do not load
on torch 2.5.1 or Kunlun. This module serves them everywhere (host emulation, CI, a
Kunlun host without the vendor wheels) and is the reference the vendor path is tested
against.

How: the weight stays packed as the checkpoint stores it (compressed-tensors'
``weight_packed``: ``[N, K / (32 / bits)]`` int32, values along K, first value in the
lowest bits, unsigned), so 4-bit weights keep their 4-bit footprint at rest. Each call
walks K in chunks: unpack the chunk's columns, subtract the zero point (the type's
bias ``2^(bits-1)`` for symmetric weights, the unpacked zero point of the column's
group otherwise), multiply by the group's scale in float32 (exact: an integer of at
most 9 bits times a bfloat16 / float16 scale), and accumulate ``x_chunk @ w_chunk.T``
in float32. Only one chunk's float weight exists at a time (``CHUNK_ELEMENTS``), never
the layer's, let alone the model's. The output is cast to the activation dtype once.
Activation order (GPTQ ``desc_act``, a ``g_idx``) is served by permuting K once at load
(``sort_by_group``) and the activation columns per call.
Removal: when torch and vLLM ship a weight-only int4 GEMM for every device we serve.
"""

from __future__ import annotations

import sys

import torch

CHUNK_ELEMENTS = 1 << 22
"""Float32 weight elements dequantized at once per call (16 MiB), whatever the layer."""


def pack_factor(bits: int) -> int:
    if bits not in (4, 8):
        raise ValueError(f"weight-only integer kernels serve 4 or 8 bits, not {bits}")
    return 32 // bits


def unpack_cols(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """``[R, C / f]`` int32 (``f = 32 / bits`` values per word, first value lowest) ->
    ``[R, C]`` int32 unsigned values."""
    return _unpack(packed, bits).to(torch.int32)


def _unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """``unpack_cols`` in the narrowest dtype at hand (uint8 on little-endian hosts)."""
    f = pack_factor(bits)
    if sys.byteorder == "little" and packed.dtype == torch.int32:
        # the words' bytes in memory order are the values' order: work on bytes
        raw = packed.contiguous().view(torch.uint8)  # [R, 4 C / f]
        if bits == 8:
            return raw
        pairs = torch.stack((raw & 0xF, raw >> 4), dim=-1)  # low nibble first
        return pairs.reshape(packed.shape[0], packed.shape[1] * f)
    mask = (1 << bits) - 1
    shifts = torch.arange(0, 32, bits, device=packed.device, dtype=torch.int32)
    vals = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & mask
    return vals.reshape(packed.shape[0], packed.shape[1] * f)


def pack_cols(values: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of ``unpack_cols``: ``[R, C]`` unsigned values -> ``[R, C / f]``."""
    f = pack_factor(bits)
    if values.shape[1] % f:
        raise ValueError(f"{values.shape[1]} columns do not pack by {f}")
    v = values.to(torch.int64).reshape(values.shape[0], -1, f)
    shifts = torch.arange(0, 32, bits, device=values.device, dtype=torch.int64)
    word = (v << shifts).sum(dim=-1)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""AutoAWQ's packing: the word's i-th nibble (shift ``4 i``) holds column
``8 w + AWQ_ORDER[i]``."""


def awq_unpack(packed: torch.Tensor) -> torch.Tensor:
    """AWQ GEMM ``qweight`` / ``qzeros`` ``[R, C / 8]`` int32 -> ``[R, C]`` unsigned
    4-bit values in column order."""
    nibbles = unpack_cols(packed, 4).reshape(packed.shape[0], -1, 8)
    out = torch.empty_like(nibbles)
    out[..., list(AWQ_ORDER)] = nibbles
    return out.reshape(packed.shape[0], -1)


def sort_by_group(
    packed: torch.Tensor, g_idx: torch.Tensor, bits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Activation order: reorder K so that each group's columns are contiguous.

    Returns (the repacked weight, the permutation ``perm`` with ``x[:, perm]`` the
    matching activation order, the group of each reordered column). A rank's slice of
    a row-parallel layer may hold any number of columns of a group: nothing about
    the group sizes is assumed."""
    perm = torch.argsort(g_idx.to(torch.int64), stable=True)
    w = unpack_cols(packed, bits)[:, perm]
    return pack_cols(w, bits), perm, g_idx.to(torch.int64)[perm].contiguous()


def chunk_columns(n: int, k: int, group_size: int, bits: int) -> int:
    """Input columns per chunk: about ``CHUNK_ELEMENTS / n``, whole groups and words."""
    step = group_size if 0 < group_size < k else pack_factor(bits)
    cols = max(step, (CHUNK_ELEMENTS // max(n, 1)) // step * step)
    return min(cols, k)


def wna16_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    bits: int,
    group_size: int,
    perm: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    col_groups: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ dequant(W).T + bias`` for a packed weight-only integer layer.

    ``x`` [..., K]; ``packed`` int32 ``[N, K / (32 / bits)]``; ``scales`` ``[N, G]``
    (G = K / group_size; G = 1 per channel); ``zeros`` ``[N, G]`` unsigned zero points
    or None (symmetric: the bias ``2^(bits-1)``); ``group_size`` -1 or K per channel;
    ``perm`` and ``col_groups`` the K permutation and the columns' groups of
    ``sort_by_group`` (activation order; None: column ``k`` is in group
    ``k // group_size``).
    """
    x2 = x.reshape(-1, x.shape[-1])
    if perm is not None:
        x2 = x2[:, perm]
    n = packed.shape[0]
    k = packed.shape[1] * pack_factor(bits)
    if x2.shape[1] != k:
        raise ValueError(f"input has {x2.shape[1]} features, the weight {k}")
    gs = k if group_size <= 0 else group_size
    step = pack_factor(bits)
    cols = chunk_columns(n, k, gs, bits)
    scales32 = scales.float()
    zeros32 = None if zeros is None else zeros.float()
    offset = float(1 << (bits - 1))
    acc = torch.zeros(x2.shape[0], n, dtype=torch.float32, device=x2.device)
    xf = x2.float()
    for k0 in range(0, k, cols):
        k1 = min(k, k0 + cols)
        q = _unpack(packed[:, k0 // step : k1 // step], bits).float()
        if col_groups is None and k0 % gs == 0 and (k1 - k0) % gs == 0:
            # whole groups: broadcast each group's scale and zero over its columns
            g0, g1 = k0 // gs, k1 // gs
            qg = q.view(n, g1 - g0, gs)
            if zeros32 is None:
                qg -= offset
            else:
                qg -= zeros32[:, g0:g1, None]
            qg *= scales32[:, g0:g1, None]
            w = q
        else:
            if col_groups is None:
                groups = torch.arange(k0, k1, device=x2.device) // gs
            else:
                groups = col_groups[k0:k1]
            zero = offset if zeros32 is None else zeros32.index_select(1, groups)
            w = (q - zero) * scales32.index_select(1, groups)
        acc.addmm_(xf[:, k0:k1], w.t())
    if bias is not None:
        acc += bias.float()
    return acc.to(x.dtype).reshape(*x.shape[:-1], n)
