"""Named runtime patches that let vLLM 0.15.1 run hybrid (Gated DeltaNet) models here:
fixes of vLLM's hybrid-model bookkeeping (state slots, prefix-cache blocks). The
patches that route vLLM's GDN kernels and its state-block copy to the plugin's kernels
are in ``vllm_kunlun/ops/gdn/patches.py``; the one that drops the drafts of a request
still prefilling in chunks (which would corrupt the GDN state too) serves every model
and is in ``vllm_kunlun/platforms/chunked_prefill_drafts.py``.

Applied in ``Phase.HYBRID_MODEL`` (``patching.phases.apply_phase`` through
``RUNTIME_PATCHES``) from the Qwen3.5 and Qwen3-Next models' constructors, i.e. in the
process that runs the model (engine core or worker), whatever ``VLLM_PLUGINS`` says;
idempotent.
Each patch keeps the original, checks that the upstream object is the one it was written
for (``PatchMismatch`` names what differs), and reverts.

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
"""

from __future__ import annotations

import functools
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

GDN_ATTN = "vllm.v1.attention.backends.gdn_attn"

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
    return expect_params(
        getattr(original, "build", None),
        "GDNAttentionMetadataBuilder.build",
        _BUILD_PARAMS,
    ) or expect_caller(
        module, "GDNAttentionBackend.get_builder_cls", "GDNAttentionMetadataBuilder"
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

PATCH_GROUPS: dict[str, tuple[AttributePatch, ...]] = {
    NEW_REQUEST_STATE: (BUILDER_PATCH,),
    MAMBA_CACHE: (CACHE_PATCH,),
}


# A mismatching upstream raises: a hybrid model served without these fixes would
# read stale state or generate wrong tokens.
GROUPS = PatchGroups(PATCH_GROUPS, "hybrid-model")
apply_one = GROUPS.apply
revert_all = GROUPS.revert_all
applied = GROUPS.applied
RUNTIME_PATCHES = GROUPS.hooks()  # phases.apply_phase's hook (patching/phases.py)
