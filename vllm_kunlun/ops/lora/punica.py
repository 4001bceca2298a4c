"""The punica wrapper vllm-kunlun's platforms name in ``get_punica_wrapper``.

Why: vLLM's LoRA layers (column / row parallel, merged QKV, logits, embedding) do not
compute the adapter products themselves: they call a per-platform punica wrapper that
holds the batch's token-to-adapter mapping. vLLM's wrappers run Triton, CUDA or IPEX
kernels, none of which serve Kunlun; this one runs the LoRA seam
(``ops/lora/seam.py``: the vendor bgmv kernels on Kunlun, the portable batched torch
kernels elsewhere) and keeps vLLM's metadata handling from ``PunicaWrapperBase``.

Every product goes through the seam's two custom ops, one call per slice: ``shrink``
gives each token ``scale * x @ A[slot]^T`` and ``expand`` adds ``h @ B[slot]^T`` into
the slice of the output; tokens without an adapter (slot -1) get nothing. Removal:
when vLLM ships a punica wrapper that runs on Kunlun.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.lora.layers import LoRAMapping
from vllm.lora.punica_wrapper.punica_base import PunicaWrapperBase

from vllm_kunlun.ops.lora.seam import lora_expand, lora_shrink


class PunicaWrapperKunlun(PunicaWrapperBase):
    """vLLM's punica interface on the LoRA seam's shrink / expand kernels."""

    def __init__(
        self,
        max_num_batched_tokens: int,
        max_batches: int,
        device: torch.device | str,
        **kwargs: Any,
    ) -> None:
        PunicaWrapperBase.__init__(self, max_num_batched_tokens, max_batches, device)

    def update_metadata(
        self,
        mapping: LoRAMapping,
        lora_index_to_id: list[int | None],
        max_loras: int,
        vocab_size: int,
        **kwargs: Any,
    ) -> None:
        # The per-token slots are all the kernels need; vLLM's sgmv segment metadata
        # (a host sync per step) is not computed.
        self.is_prefill = mapping.is_prefill
        self._update_base_metadata(mapping, lora_index_to_id, max_loras, vocab_size)

    def _token_indices(self, num_tokens: int) -> torch.Tensor:
        return torch.narrow(self._token_lora_indices, 0, 0, num_tokens)

    def add_shrink(  # type: ignore[override]
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: tuple[torch.Tensor, ...],
        scale: float,
        **kwargs: Any,
    ) -> None:
        """``y[i] = scale * x @ A_i[slot]^T`` for every slice ``i`` (y: [S, T, r])."""
        x = x.view(-1, x.shape[-1])
        indices = self._token_indices(x.size(0))
        for i, lora_a in enumerate(lora_a_stacked):
            y[i].copy_(lora_shrink(x, lora_a, indices, scale))

    def add_expand(  # type: ignore[override]
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_b_stacked: tuple[torch.Tensor, ...],
        output_slices: tuple[int, ...],
        offset_start: int = 0,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> None:
        """``y[:, slice_i] (+)= x[i] @ B_i[slot]^T`` for every slice (x: [S, T, r])."""
        y2 = y.view(-1, y.shape[-1])
        indices = self._token_indices(x.size(1))
        offset = offset_start
        for i, lora_b in enumerate(lora_b_stacked):
            size = output_slices[i]
            out = lora_expand(x[i], lora_b, indices)[:, :size].to(y2.dtype)
            target = y2[:, offset : offset + size]
            if add_inputs:
                target += out
            else:
                target.copy_(out)
            offset += size

    def add_lora_embedding(  # type: ignore[override]
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> None:
        """``y (+)= x @ B[slot]^T``: the embedding LoRA (``x`` holds A's rows)."""
        indices = self._token_indices(x.size(0))
        out = lora_expand(x, lora_b_stacked, indices).to(y.dtype)
        n = min(out.shape[1], y.shape[-1])
        if add_inputs:
            y[:, :n] += out[:, :n]
        else:
            y[:, :n] = out[:, :n]

    def add_lora_linear(  # type: ignore[override]
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: tuple[torch.Tensor, ...],
        lora_b_stacked: tuple[torch.Tensor, ...],
        scale: float,
        output_slices: tuple[int, ...],
        *,
        buffer: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> None:
        """``y[:, slice_i] += scale * x @ A_i[slot]^T @ B_i[slot]^T`` per slice."""
        assert len(lora_a_stacked) == len(lora_b_stacked) == len(output_slices)
        y2 = y.view(-1, y.shape[-1])
        x = x.view(-1, x.shape[-1])
        indices = self._token_indices(x.size(0))
        offset = 0
        for lora_a, lora_b, size in zip(
            lora_a_stacked, lora_b_stacked, output_slices, strict=True
        ):
            h = lora_shrink(x, lora_a, indices, scale)
            y2[:, offset : offset + size] += lora_expand(h, lora_b, indices)[
                :, :size
            ].to(y2.dtype)
            offset += size

    def add_lora_logits(  # type: ignore[override]
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        scale: float,
        *,
        buffer: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """``y += scale * x @ A[slot]^T @ B[slot]^T`` with the sampler's slots."""
        y2 = y.view(-1, y.shape[-1])
        x = x.view(-1, x.shape[-1])
        indices = torch.narrow(self._sampler_indices, 0, 0, x.size(0))
        h = lora_shrink(x, lora_a_stacked, indices, scale)
        out = lora_expand(h, lora_b_stacked, indices).to(y2.dtype)
        n = min(out.shape[1], y2.shape[1])
        y2[:, :n] += out[:, :n]
        return y2.view_as(y)
