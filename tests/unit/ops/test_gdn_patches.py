"""The GDN runtime patches (vllm_kunlun/ops/gdn/patches.py), one by one, on the real
vLLM 0.15.1 objects they replace: applied, doing their job, checked, reverted."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.model_executor.layers.mamba.mamba_utils import MambaStateCopyFuncCalculator
from vllm.model_executor.models import qwen3_next
from vllm.v1.worker import mamba_utils

from vllm_kunlun.ops.gdn import patches as gdn_patches
from vllm_kunlun.ops.gdn import seam as gdn
from vllm_kunlun.patching.attribute import PatchMismatch, apply_group
from vllm_kunlun.patching.phases import Phase, apply_phase


@pytest.fixture
def clean() -> Iterator[None]:
    gdn_patches.revert_all()
    yield
    gdn_patches.revert_all()


# ---- kunlun_gdn_kernels -------------------------------------------------------------------


def test_kernel_names_route_through_the_seam_and_revert(clean: None) -> None:
    originals = {op: getattr(qwen3_next, op) for op in gdn.OPS}
    assert apply_group(gdn_patches.KERNEL_PATCHES)
    for op, original in originals.items():
        routed = getattr(qwen3_next, op)
        assert routed is not original and routed.__wrapped__ is original
    assert not apply_group(gdn_patches.KERNEL_PATCHES)  # idempotent
    gdn_patches.revert_all()
    assert {op: getattr(qwen3_next, op) for op in gdn.OPS} == originals


def test_a_changed_kernel_signature_is_named() -> None:
    patch = gdn_patches.KERNEL_PATCHES[list(gdn.OPS).index("chunk_gated_delta_rule")]
    assert patch.mismatch() is None  # vLLM 0.15.1

    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None):  # type: ignore[no-untyped-def]
        return q

    problem = patch.check(qwen3_next, chunk_gated_delta_rule)
    assert problem is not None and "qwen3_next.chunk_gated_delta_rule takes" in problem


def test_a_layer_that_stops_calling_the_kernel_is_named() -> None:
    patch = gdn_patches.KERNEL_PATCHES[0]

    class Layer:
        def _forward_core(self) -> None:
            return None

    module = SimpleNamespace(Qwen3NextGatedDeltaNet=Layer)
    problem = patch.check(module, getattr(qwen3_next, patch.attr))  # type: ignore[arg-type]
    assert problem == (
        f"Qwen3NextGatedDeltaNet._forward_core no longer calls {patch.attr} by its "
        "module-level name"
    )


# ---- kunlun_mamba_copy_block --------------------------------------------------------------


def _copy_world() -> tuple[list[torch.Tensor], Any, Any, dict[str, Any]]:
    gen = torch.Generator().manual_seed(1)
    # One raw buffer holding both states of every block, as vLLM lays them out.
    raw = torch.randn(10 * (3 * 8 + 2 * 4 * 4), generator=gen)
    per_block = raw.view(10, -1)
    conv = per_block[:, :24].view(10, 3, 8)
    ssm = per_block[:, 24:].view(10, 2, 4, 4)
    config = SimpleNamespace(kv_cache_groups=[SimpleNamespace(layer_names=["l0"])])
    request = SimpleNamespace(block_ids=([3, 5, 7],))
    context = {"l0": SimpleNamespace(kv_cache=[[conv, ssm]])}
    return [conv, ssm], config, request, context


def _copy(src_idx: int, dest_idx: int, bias: int) -> tuple[list, list]:
    states, config, request, context = _copy_world()
    before = [s.clone() for s in states]
    funcs = MambaStateCopyFuncCalculator.gated_delta_net_state_copy_func()
    src: list[Any] = []
    dst: list[Any] = []
    sizes: list[int] = []
    mamba_utils.collect_mamba_copy_meta(
        src, dst, sizes, config, funcs, [0], src_idx, dest_idx, bias, request, context
    )
    mamba_utils.do_mamba_copy_block(src, dst, sizes)
    return before, states


def test_block_copy_moves_the_running_state(clean: None) -> None:
    apply_group(gdn_patches.COPY_PATCHES)
    (conv0, ssm0), (conv, ssm) = _copy(src_idx=0, dest_idx=2, bias=0)
    # get_conv_copy_spec / get_temporal_copy_spec with one accepted token: block 3 -> 7.
    assert torch.equal(conv[7], conv0[3]) and torch.equal(ssm[7], ssm0[3])
    for block in set(range(10)) - {7}:
        assert torch.equal(conv[block], conv0[block])
        assert torch.equal(ssm[block], ssm0[block])


def test_block_copy_honours_accepted_token_offsets(clean: None) -> None:
    apply_group(gdn_patches.COPY_PATCHES)
    (conv0, ssm0), (conv, ssm) = _copy(src_idx=0, dest_idx=2, bias=1)
    # Two accepted tokens: conv rows from index 1 of block 3 land at the start of
    # block 7; the SSM state comes from the next block (5).
    assert torch.equal(conv[7].flatten()[:16], conv0[3, 1:].flatten())
    assert torch.equal(conv[7].flatten()[16:], conv0[7].flatten()[16:])
    assert torch.equal(ssm[7], ssm0[5])


def test_same_block_without_offset_copies_nothing(clean: None) -> None:
    apply_group(gdn_patches.COPY_PATCHES)
    (conv0, ssm0), (conv, ssm) = _copy(src_idx=1, dest_idx=1, bias=0)
    assert torch.equal(conv, conv0) and torch.equal(ssm, ssm0)


def test_vllms_block_copy_needs_triton_and_cuda_here() -> None:
    states = _copy_world()[0]
    with pytest.raises(Exception):  # noqa: B017  (no CUDA / no Triton driver here)
        mamba_utils.do_mamba_copy_block(
            [states[0][3].data_ptr()], [states[0][7].data_ptr()], [96]
        )


def test_byte_views_stay_inside_the_state() -> None:
    state = torch.zeros(4, 8)
    with pytest.raises(ValueError, match="outside the state's storage"):
        gdn_patches.byte_view(state, state.data_ptr() + 120, 16)


def test_the_copy_patches_check_their_callers() -> None:
    for patch in gdn_patches.COPY_PATCHES:
        assert patch.mismatch() is None
    stub = SimpleNamespace(
        preprocess_mamba=lambda: None, postprocess_mamba=lambda: None
    )
    original = getattr(mamba_utils, gdn_patches.COPY_PATCHES[1].attr)
    problem = gdn_patches.COPY_PATCHES[1].check(stub, original)  # type: ignore[arg-type]
    assert (
        problem
        == "preprocess_mamba no longer calls do_mamba_copy_block by its module-level name"
    )


def test_the_triton_copy_stays_where_triton_runs(
    clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_KUNLUN_GDN", raising=False)
    monkeypatch.setattr(gdn, "triton_driver", lambda: (True, "Triton has a driver"))
    assert gdn_patches.MAMBA_COPY not in apply_phase(Phase.HYBRID_MODEL)
    monkeypatch.setenv("VLLM_KUNLUN_GDN", "portable")
    assert apply_phase(Phase.HYBRID_MODEL) == [gdn_patches.MAMBA_COPY]


def test_a_mismatch_applies_nothing_of_the_group(
    clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def collect(a, b):  # type: ignore[no-untyped-def]
        return None

    monkeypatch.setattr(mamba_utils, "collect_mamba_copy_meta", collect)
    original_do = mamba_utils.do_mamba_copy_block
    with pytest.raises(PatchMismatch, match="kunlun_mamba_copy_block not applied"):
        apply_group(gdn_patches.COPY_PATCHES)
    assert mamba_utils.do_mamba_copy_block is original_do
