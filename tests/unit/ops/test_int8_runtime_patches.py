"""The two runtime patches quantized checkpoints need on vLLM 0.15.1 + torch 2.5.1:
``torch_wrap_triton`` (the import) and ``kunlun_int8_scaled_mm_kernel`` (the kernel),
plus how ``vllm-kunlun patch status`` and the doctor show them."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from vllm_kunlun.checks.finding import Context
from vllm_kunlun.cli import main
from vllm_kunlun.doctor.patchset import check_patchset
from vllm_kunlun.ops.int8 import int8_kernel_table_patch as int8_patches
from vllm_kunlun.patching import wrap_triton
from vllm_kunlun.patching.registry import torch_fix_states as runtime_fix_states

QUTLASS = "vllm.model_executor.layers.quantization.qutlass_utils"


@pytest.fixture
def unpatched_torch() -> Iterator[None]:
    wrap_triton.revert()
    if hasattr(torch.library, "wrap_triton"):
        pytest.skip("this torch has torch.library.wrap_triton (>= 2.6)")
    yield
    wrap_triton.revert()


def test_without_the_fix_quantized_checkpoints_cannot_import(
    unpatched_torch: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, QUTLASS, raising=False)
    with pytest.raises(ImportError, match="wrap_triton"):
        importlib.import_module(QUTLASS)


def test_the_fix_adds_capture_triton_under_its_new_name_and_reverts(
    unpatched_torch: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch._library.triton import capture_triton

    assert wrap_triton.state().startswith("needed on torch 2.5.1")
    assert wrap_triton.apply() is True
    assert wrap_triton.apply() is False  # once
    assert torch.library.wrap_triton is capture_triton
    assert wrap_triton.state().startswith("applied")
    monkeypatch.delitem(sys.modules, QUTLASS, raising=False)
    assert importlib.import_module(QUTLASS).wrap_triton is capture_triton
    from vllm.model_executor.layers.quantization import get_quantization_config

    assert get_quantization_config("compressed-tensors").__name__ == (
        "CompressedTensorsConfig"
    )
    wrap_triton.revert()
    assert not hasattr(torch.library, "wrap_triton")


def test_nothing_to_do_where_torch_has_it(
    unpatched_torch: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.library, "wrap_triton", object(), raising=False)
    assert not wrap_triton.needed() and wrap_triton.apply() is False
    assert wrap_triton.state().startswith("not needed")


def test_a_changed_source_is_reported_not_guessed(
    unpatched_torch: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch._library import triton

    monkeypatch.setattr(triton, "capture_triton", lambda kernel, grid: kernel)
    state = wrap_triton.state()
    assert state.startswith("CANNOT APPLY: torch._library.triton.capture_triton takes")
    f = check_patchset(
        Context(),
        summary=lambda: (7, 7, {}),
        runtime_fixes=lambda: {wrap_triton.NAME: state},
    )
    assert f.status == "warn" and "torch_wrap_triton: CANNOT APPLY" in f.cause


def test_doctor_and_patch_status_list_the_runtime_fixes(
    capsys: pytest.CaptureFixture,
) -> None:
    states = runtime_fix_states()
    assert set(states) == {"schema_pep585", "torch_wrap_triton"}
    f = check_patchset(
        Context(), summary=lambda: (7, 7, {}), runtime_fixes=lambda: states
    )
    assert f.status == "ok" and f.details["runtime_fixes"] == states
    if not hasattr(torch.library, "wrap_triton") or wrap_triton.PATCH.applied():
        assert "runtime fixes the platform applies at start:" in f.cause
        assert "torch_wrap_triton" in f.cause
    assert main(["patch", "status", "--json"]) in (0, 1)
    out = json.loads(capsys.readouterr().out)
    assert out["runtime_fixes"]["torch_wrap_triton"] == states["torch_wrap_triton"]
    main(["patch", "status"])
    assert "runtime patches (no file changes" in capsys.readouterr().out


# ---- kunlun_int8_scaled_mm_kernel -----------------------------------------------------


@pytest.fixture
def scaled_mm() -> Iterator[Any]:
    module = importlib.import_module(int8_patches.MODULE)
    int8_patches.revert()
    yield module
    int8_patches.revert()


def test_registry_gets_an_out_of_tree_entry_and_reverts(scaled_mm: Any) -> None:
    from vllm.platforms import PlatformEnum

    from vllm_kunlun.ops.int8.int8_kernel import KunlunInt8ScaledMMLinearKernel

    original = scaled_mm._POSSIBLE_INT8_KERNELS
    assert PlatformEnum.OOT not in original  # vLLM 0.15.1: KeyError without the patch
    assert int8_patches.apply() is True
    patched = scaled_mm._POSSIBLE_INT8_KERNELS
    assert patched[PlatformEnum.OOT] == [KunlunInt8ScaledMMLinearKernel]
    assert {k: v for k, v in patched.items() if k != PlatformEnum.OOT} == original
    assert int8_patches.apply() is False
    int8_patches.revert()
    assert scaled_mm._POSSIBLE_INT8_KERNELS is original


def test_a_changed_vllm_is_left_alone_with_the_difference(
    scaled_mm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def init_int8_linear_kernel(config, module_name):  # type: ignore[no-untyped-def]
        return _POSSIBLE_INT8_KERNELS  # noqa: F821

    monkeypatch.setattr(scaled_mm, "init_int8_linear_kernel", init_int8_linear_kernel)
    assert "takes ('config', 'module_name')" in (int8_patches.PATCH.mismatch() or "")
    assert int8_patches.apply() is False
    assert not int8_patches.PATCH.applied()


def test_an_upstream_oot_entry_makes_the_patch_obsolete(
    scaled_mm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.platforms import PlatformEnum

    monkeypatch.setattr(
        scaled_mm,
        "_POSSIBLE_INT8_KERNELS",
        {**scaled_mm._POSSIBLE_INT8_KERNELS, PlatformEnum.OOT: []},
    )
    assert "obsolete" in (int8_patches.PATCH.mismatch() or "")


def test_apply_if_loaded_imports_nothing(
    scaled_mm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, int8_patches.MODULE)
    assert int8_patches.apply_if_loaded() is False
    assert int8_patches.MODULE not in sys.modules


def test_the_kernel_refuses_platforms_that_are_not_ours() -> None:
    from vllm_kunlun.ops.int8.int8_kernel import KunlunInt8ScaledMMLinearKernel

    ok, why = KunlunInt8ScaledMMLinearKernel.is_supported()
    assert not ok and "requires a vllm-kunlun platform" in str(why)
