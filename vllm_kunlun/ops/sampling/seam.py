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

``VLLM_KUNLUN_SAMPLER`` chooses: ``auto`` (vendor when importable and the tensors are
on a device; native for CPU tensors when the extension has it; else portable),
``vendor`` (fail when missing), ``native`` (fail when missing or not on the CPU),
``portable``. The choice and its reason are logged once per process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vllm_kunlun import envs, versions
from vllm_kunlun.logger import init_logger
from vllm_kunlun.ops import vendor
from vllm_kunlun.ops.sampling import native_cpu as native
from vllm_kunlun.ops.sampling import portable

logger = init_logger(__name__)

VENDOR_MODULE = "kunlun_ops"
VENDOR_FUNCTION = "top_k_top_p_sampling_from_probs"
VENDOR = vendor.VENDOR
NATIVE = "native"
PORTABLE = vendor.PORTABLE


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
    """The kernels for tensors on ``device``, per ``VLLM_KUNLUN_SAMPLER``; logs once."""
    mode = envs.VLLM_KUNLUN_SAMPLER
    kernels = _cpu_kernels(mode, device)
    if kernels is None:
        choice = vendor.choose_path(
            "VLLM_KUNLUN_SAMPLER",
            mode,
            device,
            _vendor_function,
            cpu_reason=CPU_REASON,
            demanded_fix=f"Install the vendor op library of the validated combination "
            f"({versions.label('kunlun_ops')})",
            fallback_warning="vllm-kunlun: sampling on %s uses the portable torch "
            "kernels, not the vendor kernel: %s",
        )
        kernels = SamplingKernels(choice.name, choice.reason, choice.vendor)
    logger.info_once(
        "vllm-kunlun: sampling kernels: %s (%s)", kernels.name, kernels.reason
    )
    return kernels


CPU_REASON = "the logits are on the CPU"


def _cpu_kernels(mode: str, device: torch.device) -> SamplingKernels | None:
    """The choice that is the native kernel's to make: ``native`` (it or an error), and
    ``auto`` with CPU tensors (it where it is faster, else portable torch and why);
    None leaves the choice to ``vendor.choose_path`` (devices, host emulation taking
    the vendor paths, ``vendor``, ``portable``)."""
    if mode == NATIVE:
        if device.type != "cpu":
            raise RuntimeError(
                f"VLLM_KUNLUN_SAMPLER=native runs on the CPU, but the logits are on "
                f"{device}; set VLLM_KUNLUN_SAMPLER=auto."
            )
        ok, why = native.available()
        if not ok:
            raise RuntimeError(
                f"VLLM_KUNLUN_SAMPLER=native, but {why}; or set "
                "VLLM_KUNLUN_SAMPLER=auto to use the portable torch kernels."
            )
        return SamplingKernels(NATIVE, f"VLLM_KUNLUN_SAMPLER=native; {why}")
    if mode != "auto" or device.type != "cpu" or envs.VLLM_KUNLUN_EMULATION_VENDOR:
        return None
    ok, why = native.preferred()
    return SamplingKernels(NATIVE if ok else PORTABLE, f"{CPU_REASON}; {why}")
