"""The sampling kernel seam: the vendor's flashinfer-style kernel, the plugin's native
CPU kernel, or portable torch.

Why: on Kunlun, vLLM's native sampler draws its noise with ``Tensor.exponential_``,
which has no device kernel and silently runs on the CPU (a 256 x 152K decode step took
4.89 s with the device idle). The vendor op library ships flashinfer's sampling API;
calling ``kunlun_ops.top_k_top_p_sampling_from_probs`` keeps sampling on the device.
Logits on the CPU (host emulation, CI) go to the plugin's C++ kernel
(``sampling_native``: about one read of the logits per step). Everything else (other
CUDA devices, a missing library or extension) uses the portable torch implementation in
``sampling_portable`` (flashinfer's sampling API on any device): no sort, no host sync.

``VLLM_KUNLUN_SAMPLER`` chooses: ``auto`` (the vendor kernel where the active
platform wants vendor kernels and it loads; native for CPU tensors when the extension
is preferred; else portable), ``vendor`` (fail when missing), ``native`` (fail when
missing or not on the CPU), ``portable``; ``ops/chooser.py`` makes the choice and logs
it once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vllm_kunlun.ops import chooser, vendor
from vllm_kunlun.ops.sampling import native_cpu as native
from vllm_kunlun.ops.sampling import portable

VENDOR_MODULE = "kunlun_ops"
VENDOR_FUNCTION = "top_k_top_p_sampling_from_probs"
VENDOR = chooser.VENDOR
NATIVE = chooser.NATIVE
PORTABLE = chooser.PORTABLE


@dataclass(frozen=True)
class SamplingKernels:
    """The kernels one sampler uses, and why they were chosen."""

    name: str
    reason: str
    vendor_fn: Callable[..., torch.Tensor] | None = None

    def sample_logits(
        self,
        logits: torch.Tensor,
        top_k: torch.Tensor | None,
        top_p: torch.Tensor | None,
        *,
        inplace: bool = False,
    ) -> torch.Tensor:
        """One token id per row of ``logits`` (B, V), float32; no per-row generators.

        With ``inplace`` the portable kernel may overwrite ``logits``.
        """
        if logits.shape[0] == 0:
            return torch.empty(0, dtype=torch.int64, device=logits.device)
        if self.vendor_fn is not None:
            return vendor_sample(self.vendor_fn, logits, top_k, top_p)
        uniforms = torch.rand((logits.shape[0], portable.DRAWS), device=logits.device)
        return self.sample_uniforms(logits, top_k, top_p, uniforms, inplace=inplace)

    def sample_uniforms(
        self,
        logits: torch.Tensor,
        top_k: torch.Tensor | None,
        top_p: torch.Tensor | None,
        uniforms: torch.Tensor,
        *,
        inplace: bool = False,
    ) -> torch.Tensor:
        """One token per row from the given uniforms (B, D): rows with their own
        generator. Never the vendor kernel (it takes one generator per batch)."""
        if self.name == NATIVE:  # chosen for CPU tensors only
            return native.sample(logits, top_k, top_p, uniforms)
        return portable.sample(
            logits, top_k, top_p, uniforms, scores_are_logits=True, inplace=inplace
        )


def vendor_sample(
    fn: Callable[..., torch.Tensor],
    logits: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
) -> torch.Tensor:
    """Call the vendor's ``top_k_top_p_sampling_from_probs`` as flashinfer expects.

    The kernel is always called, also when no row filters: a missing top-k becomes
    ``top_k = vocab`` and a missing top-p ``top_p = 1.0``, which is exactly the
    unfiltered distribution (so the batch never falls back to ``exponential_``).
    """
    probs = logits.softmax(dim=-1, dtype=torch.float32).contiguous()
    batch, vocab = probs.shape
    if top_k is None:
        k = torch.full((batch,), vocab, dtype=torch.int32, device=probs.device)
    else:
        k = top_k.to(device=probs.device, dtype=torch.int32).contiguous()
    if top_p is None:
        p = torch.full((batch,), 1.0, dtype=torch.float32, device=probs.device)
    else:
        p = top_p.to(device=probs.device, dtype=torch.float32).contiguous()
    tokens = fn(probs, top_k=k, top_p=p, deterministic=True)
    return tokens.view(-1)


def _vendor_function() -> tuple[Callable[..., torch.Tensor] | None, str]:
    fn, reason = vendor.function(VENDOR_MODULE, VENDOR_FUNCTION)
    return fn, (f"{reason} is available" if fn is not None else reason)


def select_kernels(device: torch.device) -> SamplingKernels:
    """The kernels for tensors on ``device``, per ``VLLM_KUNLUN_SAMPLER`` and the
    active platform's policy (``ops/chooser.py``, which logs the choice once)."""
    choice = chooser.choose(
        chooser.SAMPLING, device, vendor=_vendor_function, native=native
    )
    return SamplingKernels(choice.name, choice.reason, choice.vendor)
