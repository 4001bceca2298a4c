"""Named runtime patches that let vLLM 0.15.1 run hybrid (Gated DeltaNet) models here.

Applied in ``Phase.HYBRID_MODEL`` (``patching.phases.apply_phase`` through
``RUNTIME_PATCHES``) from the Qwen3.5 and Qwen3-Next models' constructors, i.e. in the
process that runs the model (engine core or worker), whatever ``VLLM_PLUGINS`` says;
idempotent.
Each patch keeps the original, checks that the upstream object is the one it was written
for (``PatchMismatch`` names what differs), and reverts.

* ``kunlun_gdn_kernels`` -- ``vllm.model_executor.models.qwen3_next``'s five kernel
  names (``fused_gdn_gating``, ``causal_conv1d_fn``, ``causal_conv1d_update``,
  ``chunk_gated_delta_rule``, ``fused_recurrent_gated_delta_rule``).
  Why: they are Triton-only; with no Triton driver the first prefill fails
  (``triton.next_power_of_2``), and Kunlun's vendor decode kernel never runs.
  How: each name becomes ``ops.gdn.dispatcher(op, original)``, which routes to the
  vendor kernel, the original Triton kernel, or portable torch (``VLLM_KUNLUN_GDN``).
  ``Qwen3NextGatedDeltaNet._forward_core`` looks the names up when it runs.
  Removal: when vLLM routes GDN kernels through a platform hook.

* ``kunlun_gdn_new_request_state`` -- ``vllm.v1.attention.backends.gdn_attn.
  GDNAttentionMetadataBuilder``.
  Why: ``build`` classifies every 1-token request as a decode, and in a batch without
  prefills it sets no ``has_initial_state``: a new request with a 1-token prompt (or
  a first 1-token chunk) then starts from whatever state the previous owner of its
  recycled state slot left (vLLM issue #51562; fixed upstream after 0.15.1).
  How: a subclass whose ``build`` zeroes the conv and SSM state slots of such requests
  in its layers before the step runs (eager or CUDA-graph replay alike: the zeroing
  happens outside the graph). ``GDNAttentionBackend.get_builder_cls`` looks the class
  up by its module-level name.
  Removal: with a vLLM that treats zero-context requests as prefills in GDN metadata.

* ``kunlun_mamba_cache_written`` -- ``vllm.v1.core.single_type_kv_cache_manager.
  MambaManager.cache_blocks``.
  Why: vLLM 0.15.1 caches (hashes) a request's blocks when they are scheduled, before
  the step computes them. For attention that is sound (a later request in the same step
  reads the KV the layer writes first), but with ``mamba_cache_mode='align'`` a block's
  GDN state is only copied into it after the step: a second request sharing the prefix,
  scheduled in the same step, hit the block, started from a state never written and
  generated wrong tokens (found by tests/integration/test_e2e_w8a8_hybrid.py).
  How: in align mode the manager caches only the blocks of tokens computed in earlier
  steps (``request.num_computed_tokens`` at allocation); such a request then shares the
  prefix from the next step on. Applied in the engine core (``Phase.FRONT_END``: vLLM's
  engine core loads the general plugins first thing) and, whatever ``VLLM_PLUGINS``
  says, in a model process (``Phase.MODEL_PROCESS``: the engine core itself at TP 1).
  Removal: when vLLM commits mamba blocks only once their state is written.

* ``kunlun_hybrid_prefill_drafts`` -- ``vllm.v1.worker.gpu_model_runner.GPUModelRunner.
  take_draft_token_ids`` (the CPU and emulation runners inherit it).
  Why: the drafter proposes tokens for every request of a step, also for one whose
  prefill chunk was not its last (its sampled token is discarded); the scheduler then
  schedules the rest of the prompt followed by those drafts. The runner sends such a
  request down the prefill path (it is not decoding yet), whose Gated DeltaNet state
  absorbs the draft tokens whether or not they are accepted, and writes only the
  first of the request's speculative state slots: the next steps decode from a wrong
  state (found by tests/integration/test_e2e_mtp.py: greedy output diverged from
  transformers after a chunked prefill with MTP).
  How: on hybrid models, drafts of requests whose sampled token was discarded this
  step (vLLM's ``discard_request_mask``) are dropped: the prompt finishes alone and
  drafting starts at the first decode.
  Removal: when vLLM drafts only for requests that sampled a token.

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
    apply_group,
    expect_call,
    expect_params,
)

logger = init_logger(__name__)

QWEN3_NEXT = "vllm.model_executor.models.qwen3_next"
GDN_ATTN = "vllm.v1.attention.backends.gdn_attn"
MAMBA_UTILS = "vllm.v1.worker.mamba_utils"

# ---- kunlun_gdn_kernels -------------------------------------------------------------------

# vLLM 0.15.1's signatures of the five kernels (the dispatcher binds to them).
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
        "q",
        "k",
        "v",
        "g",
        "beta",
        "scale",
        "initial_state",
        "output_final_state",
        "cu_seqlens",
        "head_first",
        "use_qk_l2norm_in_kernel",
    ),
    "fused_recurrent_gated_delta_rule": (
        "q",
        "k",
        "v",
        "g",
        "beta",
        "scale",
        "initial_state",
        "inplace_final_state",
        "cu_seqlens",
        "ssm_state_indices",
        "num_accepted_tokens",
        "use_qk_l2norm_in_kernel",
    ),
}


def _check_kernel(op: str) -> Callable[[ModuleType, Any], str | None]:
    def check(module: ModuleType, original: Any) -> str | None:
        problem = expect_params(original, f"qwen3_next.{op}", _KERNEL_PARAMS[op])
        if problem:
            return problem
        layer = getattr(module, "Qwen3NextGatedDeltaNet", None)
        return expect_call(
            getattr(layer, "_forward_core", None),
            "Qwen3NextGatedDeltaNet._forward_core",
            op,
        )

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

# ---- kunlun_gdn_new_request_state ---------------------------------------------------------

_BUILD_PARAMS = (
    "self",
    "common_prefix_len",
    "common_attn_metadata",
    "num_accepted_tokens",
    "num_decode_draft_tokens_cpu",
    "fast_build",
)


def _check_builder(module: ModuleType, original: Any) -> str | None:
    if not isinstance(original, type):
        return f"{GDN_ATTN}.GDNAttentionMetadataBuilder is not a class"
    problem = expect_params(
        getattr(original, "build", None),
        "GDNAttentionMetadataBuilder.build",
        _BUILD_PARAMS,
    )
    if problem:
        return problem
    backend = getattr(module, "GDNAttentionBackend", None)
    return expect_call(
        getattr(backend, "get_builder_cls", None),
        "GDNAttentionBackend.get_builder_cls",
        "GDNAttentionMetadataBuilder",
    )


def fresh_decode_rows(common_attn_metadata: Any, num_decodes: int) -> torch.Tensor:
    """Indices (CPU) of the decode rows that have no computed token: requests whose
    1-token prompt or first 1-token chunk runs on the decode path."""
    m = common_attn_metadata
    query_lens = (
        m.query_start_loc_cpu[1 : num_decodes + 1] - m.query_start_loc_cpu[:num_decodes]
    )
    computed = m._num_computed_tokens_cpu
    if computed is None:  # not filled by this caller: one small device-to-host copy
        computed = m.compute_num_computed_tokens().cpu()
    fresh = (computed[:num_decodes] == 0) & (query_lens == 1)
    return torch.nonzero(fresh).squeeze(1)


def fresh_non_spec_rows(
    common_attn_metadata: Any, non_spec: torch.Tensor
) -> torch.Tensor:
    """Like ``fresh_decode_rows`` in a speculative batch: indices among the
    non-speculative requests (``non_spec``, CPU mask over the batch) of those with no
    computed token and a 1-token query."""
    m = common_attn_metadata
    num_reqs = non_spec.shape[0]
    qsl = m.query_start_loc_cpu[: num_reqs + 1]
    query_lens = qsl[1:] - qsl[:-1]
    computed = m._num_computed_tokens_cpu
    if computed is None:
        computed = m.compute_num_computed_tokens().cpu()
    fresh = (computed[:num_reqs] == 0) & (query_lens == 1)
    return torch.nonzero(fresh[non_spec]).squeeze(1)


def zero_state_slots(layers: list[Any], slots: torch.Tensor) -> None:
    """Zero the state slots (conv and SSM) of every layer in ``layers``."""
    slots = slots.to(torch.long)
    for layer in layers:
        for state in layer.kv_cache[0]:
            state.index_fill_(0, slots.to(state.device), 0)


def _make_builder(original: type) -> type:
    class StateResettingGDNMetadataBuilder(original):  # type: ignore[valid-type,misc]
        """vLLM's GDN metadata builder; zeroes fresh requests' state slots (see
        ``vllm_kunlun/models/hybrid_layer_patches.py``,
        ``kunlun_gdn_new_request_state``)."""

        def __init__(
            self,
            kv_cache_spec: Any,
            layer_names: list[str],
            vllm_config: Any,
            device: torch.device,
        ) -> None:
            super().__init__(kv_cache_spec, layer_names, vllm_config, device)
            self.kunlun_layer_names = list(layer_names)

        def build(  # type: ignore[override]
            self,
            common_prefix_len: int,
            common_attn_metadata: Any,
            num_accepted_tokens: torch.Tensor | None = None,
            num_decode_draft_tokens_cpu: torch.Tensor | None = None,
            fast_build: bool = False,
        ) -> Any:
            metadata = super().build(
                common_prefix_len,
                common_attn_metadata,
                num_accepted_tokens,
                num_decode_draft_tokens_cpu,
                fast_build,
            )
            # With a prefill in the batch, has_initial_state covers every request.
            if metadata.num_prefills > 0 or metadata.num_decodes == 0:
                return metadata
            if metadata.spec_sequence_masks is None:
                rows = fresh_decode_rows(common_attn_metadata, metadata.num_decodes)
            else:
                # Speculative batch: the non-speculative decodes are the requests
                # without draft tokens, in batch order (vLLM's builder selects
                # them with ~spec_sequence_masks).
                assert num_decode_draft_tokens_cpu is not None
                rows = fresh_non_spec_rows(
                    common_attn_metadata, num_decode_draft_tokens_cpu < 0
                )
            if rows.numel():
                indices = metadata.non_spec_state_indices_tensor
                slots = indices.index_select(0, rows.to(indices.device))
                context = self.vllm_config.compilation_config.static_forward_context
                layers = [context[name] for name in self.kunlun_layer_names]
                zero_state_slots(layers, slots)
            return metadata

    StateResettingGDNMetadataBuilder.__qualname__ = "StateResettingGDNMetadataBuilder"
    return StateResettingGDNMetadataBuilder


NEW_REQUEST_STATE = "kunlun_gdn_new_request_state"
BUILDER_PATCH = AttributePatch(
    NEW_REQUEST_STATE,
    GDN_ATTN,
    "GDNAttentionMetadataBuilder",
    _make_builder,
    _check_builder,
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
        problem = expect_params(original, original.__name__, expected)
        if problem:
            return problem
        for caller in ("preprocess_mamba", "postprocess_mamba"):
            problem = expect_call(
                getattr(module, caller, None), caller, original.__name__
            )
            if problem:
                return problem
        return None

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


# ---- kunlun_mamba_cache_written ---------------------------------------------------

KV_MANAGERS = "vllm.v1.core.single_type_kv_cache_manager"
_CACHE_PARAMS = ("self", "request", "num_tokens")


def _check_cache_blocks(module: ModuleType, original: Any) -> str | None:
    manager = getattr(module, "MambaManager", None)
    if manager is None or not hasattr(manager, "find_longest_cache_hit"):
        return f"{KV_MANAGERS}.MambaManager is not vLLM 0.15.1's"
    return expect_params(original, "MambaManager.cache_blocks", _CACHE_PARAMS)


def _make_cache_blocks(original: Any) -> Any:
    @functools.wraps(original)
    def cache_computed_blocks(self: Any, request: Any, num_tokens: int) -> None:
        if getattr(self, "mamba_cache_mode", None) == "align":
            # Only blocks whose state an earlier step wrote: at allocation time
            # num_computed_tokens has not counted this step's tokens yet.
            num_tokens = min(num_tokens, request.num_computed_tokens)
        return original(self, request, num_tokens)

    return cache_computed_blocks


MAMBA_CACHE = "kunlun_mamba_cache_written"
CACHE_PATCH = AttributePatch(
    MAMBA_CACHE,
    KV_MANAGERS,
    "MambaManager.cache_blocks",
    _make_cache_blocks,
    _check_cache_blocks,
)

# ---- applying -----------------------------------------------------------------------------

# ---- kunlun_hybrid_prefill_drafts -----------------------------------------------------

GPU_RUNNER = "vllm.v1.worker.gpu_model_runner"


def _check_drafts(module: ModuleType, original: Any) -> str | None:
    problem = expect_params(original, "GPUModelRunner.take_draft_token_ids", ("self",))
    if problem:
        return problem
    runner = getattr(module, "GPUModelRunner", None)
    return expect_call(
        getattr(runner, "_prepare_inputs", None),
        "GPUModelRunner._prepare_inputs",
        "discard_request_mask",
    ) or expect_call(
        getattr(runner, "_get_draft_token_ids_cpu", None),
        "GPUModelRunner._get_draft_token_ids_cpu",
        "draft_token_ids_cpu",
    )


def without_prefill_drafts(drafts: Any, discarded: Any) -> Any:
    """``drafts`` (vLLM's ``DraftTokenIds``) with no tokens for the requests whose
    sampled token was discarded (a prefill chunk that is not the last)."""
    from vllm.v1.outputs import DraftTokenIds

    rows = [
        [] if bool(discarded[i]) else list(ids)
        for i, ids in enumerate(drafts.draft_token_ids)
    ]
    return DraftTokenIds(list(drafts.req_ids), rows)


def _make_drafts(original: Any) -> Any:
    @functools.wraps(original)
    def take_draft_token_ids(self: Any) -> Any:
        drafts = original(self)
        if drafts is None or not self.model_config.is_hybrid:
            return drafts
        discarded = self.discard_request_mask.np[: len(drafts.req_ids)]
        return without_prefill_drafts(drafts, discarded)

    return take_draft_token_ids


PREFILL_DRAFTS = "kunlun_hybrid_prefill_drafts"
DRAFTS_PATCH = AttributePatch(
    PREFILL_DRAFTS,
    GPU_RUNNER,
    "GPUModelRunner.take_draft_token_ids",
    _make_drafts,
    _check_drafts,
)

PATCH_GROUPS: dict[str, tuple[AttributePatch, ...]] = {
    GDN_KERNELS: KERNEL_PATCHES,
    NEW_REQUEST_STATE: (BUILDER_PATCH,),
    MAMBA_COPY: COPY_PATCHES,
    MAMBA_CACHE: (CACHE_PATCH,),
    PREFILL_DRAFTS: (DRAFTS_PATCH,),
}


def apply_one(name: str) -> bool:
    """Apply one hybrid-model entry (all its patches or none); True when this call did.

    A mismatching upstream raises: a hybrid model served without these fixes would
    fail at its first prefill or silently read stale state.
    """
    if name == MAMBA_COPY:
        needed, why = copy_needs_portable()
        if not needed:
            logger.info_once(
                "vllm-kunlun: %s not applied: vLLM's Triton copy can run (%s)",
                MAMBA_COPY,
                why,
            )
            return False
    if not apply_group(PATCH_GROUPS[name]):
        return False
    logger.info("vllm-kunlun: hybrid-model runtime patch %s applied", name)
    return True


# phases.apply_phase's hook (patching/phases.py)
RUNTIME_PATCHES = {
    name: (lambda phase, name=name: apply_one(name)) for name in PATCH_GROUPS
}


def revert_all() -> None:
    for patches in reversed(list(PATCH_GROUPS.values())):
        for p in reversed(patches):
            p.revert()


def applied() -> list[str]:
    return [name for name, ps in PATCH_GROUPS.items() if all(p.applied() for p in ps)]
