"""Named runtime patches that put device-side sampling into vLLM 0.15.1.

Each patch replaces one module attribute, keeps the original, checks first that the
upstream object looks like the one it was written for (and says what differs when it
does not), and can be reverted. Applied in the model process
(``Phase.MODEL_PROCESS``: ``patching.phases.apply_phase`` through ``RUNTIME_PATCHES``)
while a Kunlun platform is active.

* ``kunlun_topk_topp_sampler``: ``vllm.v1.sample.sampler.TopKTopPSampler`` ->
  ``KunlunTopKTopPSampler``, so every ``Sampler()`` built afterwards samples on the
  device (``Sampler.__init__`` looks the name up when it runs).
* ``kunlun_recovered_token_noise``: ``rejection_sampler.sample_recovered_tokens``
  without ``exponential_``.
* ``kunlun_rejection_tp_broadcast``: ``rejection_sampler.rejection_sample`` returns TP
  rank 0's tokens on every rank.
* ``kunlun_rejection_kernels``: the rejection sampler's three Triton kernels
  (``rejection_greedy_sample_kernel``, ``rejection_random_sample_kernel``,
  ``expand_kernel``) run in torch on CPU tensors or without a Triton driver (host
  emulation: speculative decoding would fail at its first verification step); all
  three or none.

Removal: when vLLM samples without ``Tensor.exponential_`` (or Kunlun gets a device
kernel for it) and keeps TP ranks consistent itself.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching.attribute import (
    AttributePatch,
    apply_group_or_warn,
    expect_caller,
    expect_params,
    platform_resolved,
)

logger = init_logger(__name__)

# ---- kunlun_topk_topp_sampler ---------------------------------------------------------


def _check_sampler(module: ModuleType, original: Any) -> str | None:
    if not isinstance(original, type):
        return f"{module.__name__}.TopKTopPSampler is not a class"
    return expect_params(
        getattr(original, "forward_native", None),
        "TopKTopPSampler.forward_native",
        ("self", "logits", "generators", "k", "p"),
    ) or expect_caller(module, "Sampler.__init__", "TopKTopPSampler")


def _make_sampler(original: Any) -> Any:
    from vllm_kunlun.ops.sampling.topk_topp import KunlunTopKTopPSampler

    return KunlunTopKTopPSampler


# ---- kunlun_recovered_token_noise / kunlun_rejection_tp_broadcast ----------------------

_RECOVERED_PARAMS = (
    "max_spec_len",
    "num_draft_tokens",
    "cu_num_draft_tokens",
    "draft_token_ids",
    "draft_probs",
    "target_probs",
    "sampling_metadata",
    "device",
)
_REJECTION_PARAMS = (
    "draft_token_ids",
    "num_draft_tokens",
    "max_spec_len",
    "cu_num_draft_tokens",
    "draft_probs",
    "target_probs",
    "bonus_token_ids",
    "sampling_metadata",
)


def _check_recovered(module: ModuleType, original: Any) -> str | None:
    problem = expect_params(original, "sample_recovered_tokens", _RECOVERED_PARAMS)
    if problem:
        return problem
    if not hasattr(module, "sample_recovered_tokens_kernel"):
        return "rejection_sampler.sample_recovered_tokens_kernel does not exist"
    return expect_caller(module, "rejection_sample", "sample_recovered_tokens")


def _make_recovered(original: Any) -> Any:
    from vllm_kunlun.ops.sampling.rejection import sample_recovered_tokens

    return sample_recovered_tokens


def _check_rejection(module: ModuleType, original: Any) -> str | None:
    return expect_params(
        original, "rejection_sample", _REJECTION_PARAMS
    ) or expect_caller(module, "RejectionSampler.forward", "rejection_sample")


def _make_rejection(original: Any) -> Any:
    from vllm_kunlun.ops.sampling.rejection import broadcasting_rejection_sample

    return broadcasting_rejection_sample(original)


# ---- kunlun_rejection_kernels -----------------------------------------------------------

REJECTION_KERNELS = "kunlun_rejection_kernels"
# kernel -> the module-level function that launches it (checked to still do so)
_KERNEL_CALLERS = {
    "rejection_greedy_sample_kernel": "rejection_sample",
    "rejection_random_sample_kernel": "rejection_sample",
    "expand_kernel": "expand_batch_to_tokens",
}


def _check_kernel(kernel: str) -> Any:
    def check(module: ModuleType, original: Any) -> str | None:
        # A Triton kernel, or the plain function vLLM's placeholder jit leaves
        # without a Triton driver.
        if not callable(original) and not hasattr(original, "__getitem__"):
            return f"rejection_sampler.{kernel} is neither a kernel nor a function"
        return expect_caller(module, _KERNEL_CALLERS[kernel], kernel)

    return check


def _make_kernel(kernel: str) -> Any:
    def make(original: Any) -> Any:
        from vllm_kunlun.ops.sampling.rejection import PORTABLE_KERNELS, GridKernel

        return GridKernel(original, PORTABLE_KERNELS[kernel])

    return make


KERNEL_PATCHES: tuple[AttributePatch, ...] = tuple(
    AttributePatch(
        REJECTION_KERNELS,
        "vllm.v1.sample.rejection_sampler",
        kernel,
        _make_kernel(kernel),
        _check_kernel(kernel),
    )
    for kernel in _KERNEL_CALLERS
)


PATCHES: tuple[AttributePatch, ...] = (
    AttributePatch(
        "kunlun_topk_topp_sampler",
        "vllm.v1.sample.sampler",
        "TopKTopPSampler",
        _make_sampler,
        _check_sampler,
    ),
    AttributePatch(
        "kunlun_recovered_token_noise",
        "vllm.v1.sample.rejection_sampler",
        "sample_recovered_tokens",
        _make_recovered,
        _check_recovered,
    ),
    AttributePatch(
        "kunlun_rejection_tp_broadcast",
        "vllm.v1.sample.rejection_sampler",
        "rejection_sample",
        _make_rejection,
        _check_rejection,
    ),
)


def apply_one(patch: AttributePatch) -> bool:
    """Apply one sampling patch (each its own registry entry: one may go in without
    another); True when this call applied it.

    Deferred while vLLM is still resolving ``current_platform``. A patch whose upstream
    target differs from vLLM 0.15.1's is skipped with a warning that names the
    difference (vLLM keeps working, with its own slower sampling there).
    """
    if not platform_resolved():
        logger.debug(
            "vllm-kunlun: sampling patches deferred until vLLM's current_platform is "
            "resolved"
        )
        return False
    done = patch.apply_or_warn("this process samples with vLLM's own code")
    if done:
        logger.info("vllm-kunlun: runtime patch %s applied", patch.name)
    return done


def apply_kernels() -> bool:
    """The rejection kernels, all three or none; True when this call applied them. A
    mismatch warns: vLLM keeps its Triton kernels (speculative decoding then needs a
    Triton device)."""
    if not platform_resolved():
        return False
    return apply_group_or_warn(
        KERNEL_PATCHES, "speculative decoding then needs vLLM's Triton kernels"
    )


# phases.apply_phase's hook (patching/phases.py)
def _kernels_hook(phase: Any) -> bool:
    return apply_kernels()


def _patch_hook(patch: AttributePatch) -> Callable[[Any], bool]:
    return lambda phase: apply_one(patch)


RUNTIME_PATCHES: dict[str, Callable[[Any], bool]] = {
    patch.name: _patch_hook(patch) for patch in PATCHES
}
RUNTIME_PATCHES[REJECTION_KERNELS] = _kernels_hook


def applied() -> list[str]:
    names = [patch.name for patch in PATCHES if patch.applied()]
    if all(p.applied() for p in KERNEL_PATCHES):
        names.append(REJECTION_KERNELS)
    return names
