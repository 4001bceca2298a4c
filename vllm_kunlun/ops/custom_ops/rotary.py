"""Rotary embedding and multimodal rotary embedding as out-of-tree CustomOps (see
``__init__.py``): vLLM's ``RotaryEmbedding`` / ``MRotaryEmbedding`` with a
``forward_oot`` on the vendor kernels (``ops/custom_ops/rotary_vendor.py``), falling back to
``forward_native`` (logged once per reason) when a kernel is missing or refuses.

Only these two classes are replaced; vLLM's scaled variants (YaRN, Llama-3, dynamic
NTK, ...) subclass them under their own names and keep their native path.

Removal: when vLLM dispatches rotary embedding to Kunlun kernels itself.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
from vllm.model_executor.layers.rotary_embedding.mrope import MRotaryEmbedding

from vllm_kunlun.ops.custom_ops import rotary_vendor as rotary
from vllm_kunlun.ops.routes import Kernels, Refused, Route

QK = tuple[torch.Tensor, torch.Tensor | None]


def _rotate(
    layer: RotaryEmbedding | MRotaryEmbedding,
    k: Kernels,
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    mrope: rotary.MRope | None = None,
) -> QK:
    """The vendor call of both classes: the cache in the query's dtype, then the vendor
    rotary with the layer's head size, cache and style (``mrope``: M-RoPE's section
    layout)."""
    layer._match_cos_sin_cache_dtype(query)
    return rotary.rotary_embedding(
        k,
        positions,
        query,
        key,
        layer.head_size,
        layer.cos_sin_cache,
        layer.is_neox_style,
        mrope,
    )


class KunlunRotaryEmbedding(RotaryEmbedding):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kunlun_route = Route("rotary_embedding", ("rotary_embedding",))

    _vendor = _rotate  # the layer's vendor step is the shared call itself

    def forward_oot(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
    ) -> QK:
        return self.kunlun_route.run(
            self._vendor, self.forward_native, positions, query, key
        )


class KunlunMRotaryEmbedding(MRotaryEmbedding):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kunlun_route = Route(
            "mrotary_embedding", ("rotary_embedding", "mrotary_embedding_neox")
        )

    def _vendor(
        self,
        k: Kernels,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
    ) -> QK:
        if offsets is not None:
            raise Refused("position offsets (no kernel argument)")
        mrope = (self.mrope_section, self.mrope_interleaved)
        return _rotate(self, k, positions, query, key, mrope)

    def forward_oot(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
    ) -> QK:
        return self.kunlun_route.run(
            self._vendor, self.forward_native, positions, query, key, offsets
        )
