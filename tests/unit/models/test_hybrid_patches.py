"""The hybrid-model runtime patches (vllm_kunlun/models/hybrid_layer_patches.py), one
by one, on the real vLLM 0.15.1 objects they replace: applied, doing their job,
checked, reverted."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.config import DeviceConfig, VllmConfig
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends import gdn_attn
from vllm.v1.kv_cache_interface import MambaSpec
from vllm.v1.worker import mamba_utils

from vllm_kunlun.models import hybrid_layer_patches, qwen3_next_mtp
from vllm_kunlun.ops.gdn import patches as gdn_patches
from vllm_kunlun.patching.phases import Phase, apply_phase
from vllm_kunlun.platforms import chunked_prefill_drafts


@pytest.fixture
def clean() -> Iterator[None]:
    hybrid_layer_patches.revert_all()
    gdn_patches.revert_all()
    chunked_prefill_drafts.revert()
    qwen3_next_mtp.revert()
    yield
    hybrid_layer_patches.revert_all()
    gdn_patches.revert_all()
    chunked_prefill_drafts.revert()
    qwen3_next_mtp.revert()


# ---- kunlun_gdn_new_request_state ---------------------------------------------------------

CONV_SHAPE, SSM_SHAPE = (3, 8), (2, 4, 4)


def _builder(cls: type, layers: dict[str, Any]) -> Any:
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    config.compilation_config.static_forward_context.update(layers)
    spec = MambaSpec(
        shapes=(CONV_SHAPE, SSM_SHAPE),
        dtypes=(torch.float32, torch.float32),
        block_size=16,
        mamba_type="gdn_attention",
        mamba_cache_mode="none",
    )
    return cls(spec, list(layers), config, torch.device("cpu"))


def _layers(num_slots: int = 6) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    return {
        f"model.layers.{i}.linear_attn": SimpleNamespace(
            kv_cache=[
                [
                    torch.randn(num_slots, *CONV_SHAPE, generator=gen) + 5,
                    torch.randn(num_slots, *SSM_SHAPE, generator=gen) + 5,
                ]
            ]
        )
        for i in range(2)
    }


def _metadata(query_lens: list[int], computed: list[int], slots: list[int]) -> Any:
    qsl = torch.tensor(
        [0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32
    )
    computed_t = torch.tensor(computed, dtype=torch.int32)
    seq_lens = computed_t + torch.tensor(query_lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.clone(),
        seq_lens=seq_lens,
        num_reqs=len(query_lens),
        num_actual_tokens=int(qsl[-1]),
        max_query_len=max(query_lens),
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=torch.tensor(slots, dtype=torch.int32)[:, None],
        slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.int64),
        _num_computed_tokens_cpu=computed_t.clone(),
    )


def _states(layers: dict[str, Any]) -> list[torch.Tensor]:
    return [t.clone() for layer in layers.values() for t in layer.kv_cache[0]]


def test_vllms_builder_leaves_a_fresh_decode_on_a_stale_slot(clean: None) -> None:
    """The bug: a decode-only batch with a new 1-token request sets no initial-state
    flags, so the request reads whatever its recycled slot holds."""
    layers = _layers()
    assert not hybrid_layer_patches.BUILDER_PATCH.applied()
    builder = _builder(gdn_attn.GDNAttentionMetadataBuilder, layers)
    before = _states(layers)
    metadata = builder.build(0, _metadata([1, 1], [7, 0], [2, 4]))
    assert (metadata.num_decodes, metadata.num_prefills) == (2, 0)
    assert metadata.has_initial_state is None
    assert all(torch.equal(a, b) for a, b in zip(before, _states(layers), strict=True))


def test_a_fresh_decode_starts_from_zero_state(clean: None) -> None:
    hybrid_layer_patches.BUILDER_PATCH.apply()
    cls = gdn_attn.GDNAttentionMetadataBuilder
    assert cls.__name__ == "StateResettingGDNMetadataBuilder"
    assert issubclass(cls, hybrid_layer_patches.BUILDER_PATCH._original)
    assert gdn_attn.GDNAttentionBackend.get_builder_cls() is cls
    layers = _layers()
    before = _states(layers)
    # rows: a running decode (slot 2), a new 1-token prompt (slot 4), a decode (slot 1)
    metadata = _metadata([1, 1, 1], [7, 0, 3], [2, 4, 1])
    _builder(cls, layers).build(0, metadata)
    after = _states(layers)
    for old, new in zip(before, after, strict=True):
        assert torch.count_nonzero(new[4]) == 0  # the fresh request's slot, every layer
        for slot in (0, 1, 2, 3, 5):
            assert torch.equal(old[slot], new[slot])


def test_batches_with_a_prefill_are_left_to_has_initial_state(clean: None) -> None:
    hybrid_layer_patches.BUILDER_PATCH.apply()
    layers = _layers()
    before = _states(layers)
    metadata = _builder(gdn_attn.GDNAttentionMetadataBuilder, layers).build(
        0, _metadata([1, 1, 5], [7, 0, 0], [2, 4, 1])
    )
    assert metadata.num_prefills > 0
    assert metadata.has_initial_state.tolist() == [True, False, False]
    assert all(torch.equal(a, b) for a, b in zip(before, _states(layers), strict=True))


def test_the_builder_patch_checks_its_target() -> None:
    assert hybrid_layer_patches.BUILDER_PATCH.mismatch() is None

    class Builder:
        def build(self, common_prefix_len, common_attn_metadata):  # type: ignore[no-untyped-def]
            return None

    problem = hybrid_layer_patches.BUILDER_PATCH.check(gdn_attn, Builder)
    assert problem is not None and "GDNAttentionMetadataBuilder.build takes" in problem


# ---- applying ---------------------------------------------------------------------------


def test_the_hybrid_phase_is_idempotent_and_reverts(clean: None) -> None:
    before = (gdn_attn.GDNAttentionMetadataBuilder, mamba_utils.do_mamba_copy_block)
    assert apply_phase(Phase.HYBRID_MODEL) == [
        gdn_patches.GDN_KERNELS,
        hybrid_layer_patches.NEW_REQUEST_STATE,
        chunked_prefill_drafts.NAME,
        gdn_patches.MAMBA_COPY,  # no Triton driver on this host
        qwen3_next_mtp.NAME,
    ]
    assert apply_phase(Phase.HYBRID_MODEL) == []
    # The mamba cache patch belongs to the engine core's phases, not this one.
    assert sorted(hybrid_layer_patches.applied()) == sorted(
        set(hybrid_layer_patches.PATCH_GROUPS) - {hybrid_layer_patches.MAMBA_CACHE}
    )
    assert sorted(gdn_patches.applied()) == sorted(gdn_patches.PATCH_GROUPS)
    assert chunked_prefill_drafts.applied() == [chunked_prefill_drafts.NAME]
    hybrid_layer_patches.revert_all()
    gdn_patches.revert_all()
    chunked_prefill_drafts.revert()
    mtp_layer = qwen3_next_mtp.PATCHES[0]
    assert mtp_layer.applied()
    qwen3_next_mtp.revert()
    assert not mtp_layer.applied()
    assert (
        gdn_attn.GDNAttentionMetadataBuilder,
        mamba_utils.do_mamba_copy_block,
    ) == before
    assert hybrid_layer_patches.applied() == gdn_patches.applied() == []
    assert chunked_prefill_drafts.applied() == []


# ---- kunlun_mamba_cache_written -----------------------------------------------


def _mamba_manager(mode: str) -> Any:
    """vLLM's own MambaManager over its own BlockPool: 16-token pages, 8 blocks."""
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager
    from vllm.v1.kv_cache_interface import MambaSpec

    spec = MambaSpec(
        block_size=16,
        shapes=((4, 4),),
        dtypes=(torch.float32,),
        mamba_cache_mode=mode,
    )
    pool = BlockPool(num_gpu_blocks=8, enable_caching=True, hash_block_size=16)
    return MambaManager(
        spec,
        block_pool=pool,
        enable_caching=True,
        kv_cache_group_id=0,
        dcp_world_size=1,
        pcp_world_size=1,
    )


def _request(tokens: int, computed: int) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    request = Request(
        request_id="r",
        prompt_token_ids=list(range(tokens)),
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        eos_token_id=None,
        block_hasher=get_request_block_hasher(16, sha256),
    )
    request.num_computed_tokens = computed
    return request


@pytest.mark.parametrize(
    ("mode", "computed", "cached"),
    [("align", 0, 0), ("align", 32, 2), ("none", 0, 3)],
)
def test_mamba_pages_are_cached_once_their_state_exists(
    clean: None, mode: str, computed: int, cached: int
) -> None:
    """Scheduling 48 tokens of which ``computed`` ran in earlier steps: in align mode only
    those pages are committed to the prefix cache (vLLM alone commits all 3); other
    modes are untouched."""
    assert hybrid_layer_patches.apply_one(hybrid_layer_patches.MAMBA_CACHE)
    manager = _mamba_manager(mode)
    request = _request(48, computed)
    manager.allocate_new_blocks(request.request_id, 48, 48)
    manager.cache_blocks(request, 48)
    assert manager.num_cached_block.get(request.request_id, 0) == cached
