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

Removal: when vLLM samples without ``Tensor.exponential_`` (or Kunlun gets a device
kernel for it) and keeps TP ranks consistent itself.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching.attribute import (
    AttributePatch,
    expect_call,
    expect_params,
    platform_resolved,
)

logger = init_logger(__name__)

# ---- kunlun_topk_topp_sampler ---------------------------------------------------------


def _check_sampler(module: ModuleType, original: Any) -> str | None:
    if not isinstance(original, type):
        return f"{module.__name__}.TopKTopPSampler is not a class"
    problem = expect_params(
        getattr(original, "forward_native", None),
        "TopKTopPSampler.forward_native",
        ("self", "logits", "generators", "k", "p"),
    )
    if problem:
        return problem
    sampler = getattr(module, "Sampler", None)
    return expect_call(
        getattr(sampler, "__init__", None), "Sampler.__init__", "TopKTopPSampler"
    )


def _make_sampler(original: Any) -> Any:
    from vllm_kunlun.sample.topk_topp import KunlunTopKTopPSampler

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
    return expect_call(
        getattr(module, "rejection_sample", None),
        "rejection_sample",
        "sample_recovered_tokens",
    )


def _make_recovered(original: Any) -> Any:
    from vllm_kunlun.sample.rejection import sample_recovered_tokens

    return sample_recovered_tokens


def _check_rejection(module: ModuleType, original: Any) -> str | None:
    problem = expect_params(original, "rejection_sample", _REJECTION_PARAMS)
    if problem:
        return problem
    sampler_cls = getattr(module, "RejectionSampler", None)
    return expect_call(
        getattr(sampler_cls, "forward", None),
        "RejectionSampler.forward",
        "rejection_sample",
    )


def _make_rejection(original: Any) -> Any:
    from vllm_kunlun.sample.rejection import broadcasting_rejection_sample

    return broadcasting_rejection_sample(original)


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


# phases.apply_phase's hook (patching/phases.py)
RUNTIME_PATCHES = {
    patch.name: (lambda phase, patch=patch: apply_one(patch)) for patch in PATCHES
}


def applied() -> list[str]:
    return [patch.name for patch in PATCHES if patch.applied()]
