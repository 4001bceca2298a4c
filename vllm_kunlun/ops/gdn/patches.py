"""Named runtime patches that put the plugin's Gated DeltaNet kernels under vLLM 0.15.1's
hybrid (GDN) layers: vLLM's GDN kernels and its mamba state-block copy.

Applied in ``Phase.HYBRID_MODEL`` (``patching.phases.apply_phase`` through
``RUNTIME_PATCHES``) from the Qwen3.5 model's constructor, i.e. in the process that
runs the model (engine core or worker), whatever ``VLLM_PLUGINS`` says; idempotent.
Each patch keeps the original, checks that the upstream object is the one it was written
for (``PatchMismatch`` names what differs), and reverts. The hybrid-model patches that
fix vLLM's bookkeeping rather than route kernels are in
``vllm_kunlun/models/hybrid_layer_patches.py``.

* ``kunlun_gdn_kernels`` -- ``vllm.model_executor.models.qwen3_next``'s five kernel
  names (``fused_gdn_gating``, ``causal_conv1d_fn``, ``causal_conv1d_update``,
  ``chunk_gated_delta_rule``, ``fused_recurrent_gated_delta_rule``).
  Why: they are Triton-only; with no Triton driver the first prefill fails
  (``triton.next_power_of_2``), and Kunlun's vendor decode kernel never runs.
  How: each name becomes ``ops.gdn.dispatcher(op, original)``, which routes to the
  vendor kernel, the original Triton kernel, or portable torch (``VLLM_KUNLUN_GDN``).
  ``Qwen3NextGatedDeltaNet._forward_core`` looks the names up when it runs.
  Removal: when vLLM routes GDN kernels through a platform hook.

* ``kunlun_mamba_copy_block`` -- ``vllm.v1.worker.mamba_utils.collect_mamba_copy_meta``
  and ``do_mamba_copy_block`` (both or neither).
  Why: prefix caching on a hybrid model runs ``mamba_cache_mode='align'``, which copies
  state blocks through a Triton ``batch_memcpy`` on raw pointers with ``device="cuda"``
  hard-coded; without a Triton driver (or off CUDA) the first cache-aligned step fails.
  How: applied only when Triton has no active driver or ``VLLM_KUNLUN_GDN=portable``;
  ``collect`` records byte views of the same source and destination ranges (from the
  model's own copy specs), ``do`` copies them with ``Tensor.copy_`` on their device.
  Removal: when vLLM's mamba block copy has a non-Triton path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching.attribute import (
    AttributePatch,
    PatchGroups,
    expect_caller,
    expect_params,
)

logger = init_logger(__name__)

QWEN3_NEXT = "vllm.model_executor.models.qwen3_next"
MAMBA_UTILS = "vllm.v1.worker.mamba_utils"

# ---- kunlun_gdn_kernels -------------------------------------------------------------------

# The leading parameters both gated delta rule kernels take.
_DELTA_RULE_HEAD = ("q", "k", "v", "g", "beta", "scale", "initial_state")
# vLLM 0.15.1's signatures of the five kernels (the seam maps each call onto them).
_KERNEL_PARAMS = {
    "fused_gdn_gating": ("A_log", "a", "b", "dt_bias", "beta", "threshold"),
    "causal_conv1d_fn": (
        "x",
        "weight",
        "bias",
        "conv_states",
        "query_start_loc",
        "cache_indices",
        "has_initial_state",
        "activation",
        "pad_slot_id",
        "block_idx_first_scheduled_token",
        "block_idx_last_scheduled_token",
        "initial_state_idx",
        "num_computed_tokens",
        "block_size_to_align",
        "metadata",
        "validate_data",
    ),
    "causal_conv1d_update": (
        "x",
        "conv_state",
        "weight",
        "bias",
        "activation",
        "conv_state_indices",
        "num_accepted_tokens",
        "query_start_loc",
        "max_query_len",
        "pad_slot_id",
        "block_idx_last_scheduled_token",
        "initial_state_idx",
        "validate_data",
    ),
    "chunk_gated_delta_rule": (
        *_DELTA_RULE_HEAD,
        "output_final_state",
        "cu_seqlens",
        "head_first",
        "use_qk_l2norm_in_kernel",
    ),
    "fused_recurrent_gated_delta_rule": (
        *_DELTA_RULE_HEAD,
        "inplace_final_state",
        "cu_seqlens",
        "ssm_state_indices",
        "num_accepted_tokens",
        "use_qk_l2norm_in_kernel",
    ),
}


def _check_kernel(op: str) -> Callable[[ModuleType, Any], str | None]:
    def check(module: ModuleType, original: Any) -> str | None:
        return expect_params(
            original, f"qwen3_next.{op}", _KERNEL_PARAMS[op]
        ) or expect_caller(module, "Qwen3NextGatedDeltaNet._forward_core", op)

    return check


def _make_kernel(op: str) -> Callable[[Any], Any]:
    def make(original: Any) -> Any:
        from vllm_kunlun.ops.gdn.seam import dispatcher

        return dispatcher(op, original)

    return make


GDN_KERNELS = "kunlun_gdn_kernels"
KERNEL_PATCHES = tuple(
    AttributePatch(GDN_KERNELS, QWEN3_NEXT, op, _make_kernel(op), _check_kernel(op))
    for op in _KERNEL_PARAMS
)

# ---- kunlun_mamba_copy_block --------------------------------------------------------------

_COLLECT_PARAMS = (
    "src_state_list",
    "dest_state_list",
    "num_elements_list",
    "kv_cache_config",
    "mamba_state_copy_funcs",
    "mamba_group_ids",
    "src_block_idx",
    "dest_block_idx",
    "accept_token_bias",
    "req_state",
    "forward_context",
)
_DO_PARAMS = ("src_state_list", "dest_state_list", "num_elements_list")


def _check_copy(expected: tuple[str, ...]) -> Callable[[ModuleType, Any], str | None]:
    def check(module: ModuleType, original: Any) -> str | None:
        name = original.__name__
        return (
            expect_params(original, name, expected)
            or expect_caller(module, "preprocess_mamba", name)
            or expect_caller(module, "postprocess_mamba", name)
        )

    return check


def byte_view(state: torch.Tensor, address: int, nbytes: int) -> torch.Tensor:
    """The ``nbytes`` bytes at ``address`` inside ``state``'s storage, as a uint8 view."""
    storage = state.untyped_storage()
    offset = address - storage.data_ptr()
    if offset < 0 or offset + nbytes > storage.nbytes():
        raise ValueError(
            f"mamba state copy range [{offset}, {offset + nbytes}) lies outside the "
            f"state's storage of {storage.nbytes()} bytes"
        )
    flat = torch.empty(0, dtype=torch.uint8, device=state.device).set_(storage)
    return flat[offset : offset + nbytes]


def _make_collect(original: Any) -> Any:
    @functools.wraps(original)
    def collect_mamba_copy_views(
        src_state_list: list[Any],
        dest_state_list: list[Any],
        num_elements_list: list[int],
        kv_cache_config: Any,
        mamba_state_copy_funcs: tuple[Any, ...],
        mamba_group_ids: list[int],
        src_block_idx: int,
        dest_block_idx: int,
        accept_token_bias: int,
        req_state: Any,
        forward_context: dict[str, Any],
    ) -> None:
        if src_block_idx == dest_block_idx and accept_token_bias == 0:
            return
        for group_id in mamba_group_ids:
            block_ids = req_state.block_ids[group_id]
            dest_block_id = block_ids[dest_block_idx]
            for name in kv_cache_config.kv_cache_groups[group_id].layer_names:
                for state, copy_func in zip(
                    forward_context[name].kv_cache[0],
                    mamba_state_copy_funcs,
                    strict=False,
                ):
                    spec = copy_func(
                        state, block_ids, src_block_idx, accept_token_bias + 1
                    )
                    nbytes = spec.num_elements * state.element_size()
                    src_state_list.append(byte_view(state, spec.start_addr, nbytes))
                    dest_state_list.append(
                        byte_view(state, state[dest_block_id].data_ptr(), nbytes)
                    )
                    num_elements_list.append(nbytes)

    return collect_mamba_copy_views


def _make_do(original: Any) -> Any:
    @functools.wraps(original)
    def copy_mamba_blocks(
        src_state_list: list[Any],
        dest_state_list: list[Any],
        num_elements_list: list[int],
    ) -> None:
        for src, dst in zip(src_state_list, dest_state_list, strict=True):
            dst.copy_(src)

    return copy_mamba_blocks


MAMBA_COPY = "kunlun_mamba_copy_block"
COPY_PATCHES = (
    AttributePatch(
        MAMBA_COPY,
        MAMBA_UTILS,
        "collect_mamba_copy_meta",
        _make_collect,
        _check_copy(_COLLECT_PARAMS),
    ),
    AttributePatch(
        MAMBA_COPY,
        MAMBA_UTILS,
        "do_mamba_copy_block",
        _make_do,
        _check_copy(_DO_PARAMS),
    ),
)


def copy_needs_portable() -> tuple[bool, str]:
    from vllm_kunlun.ops import chooser
    from vllm_kunlun.ops.gdn.seam import triton_driver

    if chooser.mode_of(chooser.GDN) == chooser.PORTABLE:
        return True, "VLLM_KUNLUN_GDN=portable"
    has_triton, why = triton_driver()
    return (not has_triton), why


PATCH_GROUPS: dict[str, tuple[AttributePatch, ...]] = {
    GDN_KERNELS: KERNEL_PATCHES,
    MAMBA_COPY: COPY_PATCHES,
}


def _skip(name: str) -> str | None:
    """vLLM's own Triton block copy stays where it can run."""
    if name != MAMBA_COPY:
        return None
    needed, why = copy_needs_portable()
    return None if needed else f"vLLM's Triton copy can run ({why})"


# A mismatching upstream raises: a hybrid model served without these patches would
# fail at its first prefill (no Triton driver) or never run the vendor kernel.
GROUPS = PatchGroups(PATCH_GROUPS, "GDN", skip=_skip)
apply_one = GROUPS.apply
revert_all = GROUPS.revert_all
applied = GROUPS.applied
RUNTIME_PATCHES = GROUPS.hooks()  # phases.apply_phase's hook (patching/phases.py)
