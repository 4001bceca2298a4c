"""``KunlunTopKTopPSampler``: vLLM's top-k / top-p sampler without host fallbacks.

Why: vLLM 0.15.1's ``TopKTopPSampler`` on an out-of-tree platform always runs
``forward_native``, whose noise comes from ``Tensor.exponential_`` (CPU-only on Kunlun)
and whose top-p path sorts the whole vocabulary.
How:
* no per-request generators: always the kernel seam (``ops.sampling``): the vendor's
  ``top_k_top_p_sampling_from_probs`` with ``top_k = vocab`` / ``top_p = 1.0`` filled in
  when absent, the native CPU kernel, or the portable torch kernel;
* per-request generators: the native (CPU) or portable kernel with ``DRAWS`` uniforms
  per row, drawn by ``uniform_`` with the row's own generator (one batched draw for the
  other rows);
* ``processed_logits`` / ``processed_logprobs``: the filtered logits are computed first
  (sort-free) and returned; sampling then runs on them unfiltered;
* tensor parallel: TP rank 0's tokens are broadcast (``sample.tp``);
* ``apply_top_k_top_p``: vLLM's function, same signature (``(logits, k, p)``), sort-free.
Installed by the runtime patch ``kunlun_topk_topp_sampler``
(``sample.sampler_patches``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

from vllm_kunlun.ops.sampling import portable
from vllm_kunlun.ops.sampling.noise import row_uniforms
from vllm_kunlun.ops.sampling.seam import SamplingKernels, select_kernels
from vllm_kunlun.ops.sampling.tp import broadcast_from_first_rank

_PROCESSED = ("processed_logits", "processed_logprobs")


def apply_top_k_top_p(
    logits: torch.Tensor,
    k: torch.Tensor | None,
    p: torch.Tensor | None,
) -> torch.Tensor:
    """vLLM's ``apply_top_k_top_p`` (same signature and semantics), without sorting.

    Tokens outside top-k / top-p get -inf, in place; a ``k`` / ``p`` tensor of one value
    applies to every row (vLLM broadcasts a single ``p``; for a single ``k`` its own code
    takes row 0's k-th value as every row's threshold).
    """
    return portable.mask_logits(logits, k, p)


class KunlunTopKTopPSampler(TopKTopPSampler):
    """Drop-in for vLLM's ``TopKTopPSampler`` (same constructor and call signature)."""

    def __init__(self, logprobs_mode: str = "raw_logprobs") -> None:
        # Not TopKTopPSampler.__init__: it binds self.forward to one of vLLM's paths
        # (forward_native on this platform).
        nn.Module.__init__(self)
        self.logprobs_mode = logprobs_mode
        self.apply_top_k_top_p = apply_top_k_top_p
        self._kernels: SamplingKernels | None = None

    def kernels(self, device: torch.device) -> SamplingKernels:
        if self._kernels is None:
            self._kernels = select_kernels(device)
        return self._kernels

    def forward(
        self,
        logits: torch.Tensor,
        generators: dict[int, torch.Generator],
        k: torch.Tensor | None,
        p: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Sample one token per row; may update ``logits`` in place (as vLLM's)."""
        to_return: torch.Tensor | None = None
        keep_logits = self.logprobs_mode == "processed_logits"
        if self.logprobs_mode in _PROCESSED:
            logits = apply_top_k_top_p(logits, k, p)
            if keep_logits:
                to_return = logits
            else:
                to_return = logits.log_softmax(dim=-1, dtype=torch.float32)
            k = p = None
        kernels = self.kernels(logits.device)
        if generators:
            uniforms = row_uniforms(
                logits.shape[0], generators, logits.device, portable.DRAWS
            )
            tokens = kernels.sample_uniforms(
                logits, k, p, uniforms, inplace=not keep_logits
            )
        else:
            tokens = kernels.sample_logits(logits, k, p, inplace=not keep_logits)
        tokens = broadcast_from_first_rank(tokens)
        return tokens.view(-1), to_return

    # vLLM's own paths, should anything call them directly, sample on the device too.
    forward_native = forward
    forward_cpu = forward
    forward_cuda = forward
    forward_hip = forward
