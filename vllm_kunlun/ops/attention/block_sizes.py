"""Attention pages and kernel blocks: the default page, and the kernel block vLLM's
model runner gives a backend for a page (the arithmetic the backends, the platform and
the KV budget check share; no vLLM at import)."""

from __future__ import annotations

from typing import Any

DEFAULT_BLOCK_SIZE = 16
"""Tokens per KV page when vLLM is not told (the Kunlun platform's default, Triton
attention's); here so that the KV budget check and the platform share one number."""


def kernel_block_size(backend: Any, block_size: int) -> int | None:
    """The kernel block vLLM's model runner gives ``backend`` for a KV-manager block of
    ``block_size`` tokens, or None when it has none (the engine would fail at start
    with "No common block size").

    The manager block itself when a declared size accepts it (an ``int`` equal to it or
    a ``MultipleOf`` dividing it); else the largest declared ``int`` size that divides
    it: the runner then splits each manager block into that many kernel blocks.
    """
    from vllm.v1.attention.backend import MultipleOf

    declared = backend.get_supported_kernel_block_sizes()
    if not declared:
        return block_size

    def accepts(size: int) -> bool:
        return any(
            size % d.base == 0 if isinstance(d, MultipleOf) else size == d
            for d in declared
        )

    if accepts(block_size):
        return block_size
    fixed = sorted({d for d in declared if isinstance(d, int)}, reverse=True)
    return next((d for d in fixed if block_size % d == 0 and accepts(d)), None)


def describe_kernel_block_sizes(backend: Any) -> str:
    """``multiples of 16``, ``16 or 32``: a backend's declared sizes in words."""
    from vllm.v1.attention.backend import MultipleOf

    words = [
        ("any size" if d.base == 1 else f"multiples of {d.base}")
        if isinstance(d, MultipleOf)
        else str(d)
        for d in backend.get_supported_kernel_block_sizes()
    ]
    return " or ".join(words) or "any size"


def block_size_reason(backend: Any, block_size: int | None) -> str | None:
    """Why ``backend`` cannot serve pages of ``block_size`` tokens, or None if it can."""
    if block_size is None or kernel_block_size(backend, block_size) is not None:
        return None
    return (
        f"attention block size {block_size} cannot be split into its kernel blocks "
        f"({describe_kernel_block_sizes(backend)})"
    )
