"""Runtime patch kunlun_weak_ref_tensor: vLLM's graph wrapper reaches our native op.

The tensors go through ``vllm.utils.torch_utils.weak_ref_tensors``, the function vLLM's
``CUDAGraphWrapper`` calls on every captured output, with the real vLLM 0.15.1.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from types import ModuleType

import numpy as np
import pytest
import torch
import vllm.utils.torch_utils as torch_utils

from vllm_kunlun.ops import native
from vllm_kunlun.patching import weak_ref
from vllm_kunlun.patching.attribute import PatchMismatch

pytestmark = pytest.mark.skipif(
    not native.load(), reason="native extension not built (VLLM_KUNLUN_BUILD_EXT=0)"
)


@pytest.fixture
def patched() -> Iterator[ModuleType]:
    original = torch_utils.weak_ref_tensor
    assert weak_ref.apply()
    yield torch_utils
    weak_ref.revert()
    assert torch_utils.weak_ref_tensor is original


def test_vllm_has_no_working_op_of_its_own() -> None:
    # Why the patch exists: vllm._C does not load on torch 2.5.1.
    assert not hasattr(torch.ops._C, "weak_ref_tensor")
    with pytest.raises((AttributeError, RuntimeError)):
        torch_utils.weak_ref_tensors(torch.ones(3))


def test_graph_wrapper_path_shares_storage(patched: ModuleType) -> None:
    src = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    ref = patched.weak_ref_tensors(src)
    assert ref.data_ptr() == src.data_ptr()
    assert (ref.shape, ref.stride()) == (src.shape, src.stride())
    src[1, 2] = -5.0
    assert ref[1, 2].item() == -5.0
    # Lists and tuples (piecewise graphs return tuples) go element by element.
    a, b = patched.weak_ref_tensors((src, src[1:]))
    assert (a.data_ptr(), b.data_ptr()) == (src.data_ptr(), src[1:].data_ptr())


def test_weak_ref_does_not_keep_the_memory_alive(patched: ModuleType) -> None:
    def numpy_backed() -> tuple[torch.Tensor, weakref.ref]:
        # The tensor's storage owns the array: the array lives exactly as long as
        # something holds that storage.
        array = np.arange(64, dtype=np.float32)
        return torch.from_numpy(array), weakref.ref(array)

    src, alive = numpy_backed()
    ref = patched.weak_ref_tensors(src)
    assert alive() is not None
    del src
    gc.collect()
    assert alive() is None  # freed although `ref` still exists
    del ref

    # Control: an ordinary view does keep the memory alive.
    src, alive = numpy_backed()
    view = src.view(8, 8)
    del src
    gc.collect()
    assert alive() is not None
    del view


def test_empty_tensors_and_non_tensors_pass_through(patched: ModuleType) -> None:
    empty = torch.empty(0)
    assert patched.weak_ref_tensor(empty) is empty
    assert patched.weak_ref_tensor(None) is None


def test_apply_is_idempotent_and_revert_restores(patched: ModuleType) -> None:
    assert patched.weak_ref_tensor is weak_ref.weak_ref_tensor
    assert weak_ref.apply() is False  # already in
    assert weak_ref.applied()


def test_a_changed_upstream_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def other(tensor, keep):  # type: ignore[no-untyped-def]
        return tensor

    monkeypatch.setattr(torch_utils, "weak_ref_tensor", other)
    with pytest.raises(PatchMismatch, match=r"takes \('tensor', 'keep'\)"):
        weak_ref.apply()
    assert torch_utils.weak_ref_tensor is other
    # weak_ref_tensors no longer calling it by name would make the patch useless.
    monkeypatch.undo()
    monkeypatch.setattr(torch_utils, "weak_ref_tensors", lambda tensors: tensors)
    assert "no longer calls weak_ref_tensor" in (weak_ref.PATCH.mismatch() or "")


def test_the_platform_applies_it_with_its_kernels() -> None:
    from vllm_kunlun.platforms.kunlun import KunlunPlatform

    try:
        KunlunPlatform.import_kernels()
        assert torch_utils.weak_ref_tensor is weak_ref.weak_ref_tensor
    finally:
        weak_ref.revert()
