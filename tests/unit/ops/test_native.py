"""The plugin's own native op: torch.ops.vllm_kunlun.weak_ref_tensor."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.conftest import run_python
from vllm_kunlun.ops import native

pytestmark = pytest.mark.skipif(
    not native.load(), reason="native extension not built (VLLM_KUNLUN_BUILD_EXT=0)"
)


def weak_ref(t: torch.Tensor) -> torch.Tensor:
    return torch.ops.vllm_kunlun.weak_ref_tensor(t)


def test_aliases_storage_and_writes_are_visible_both_ways() -> None:
    src = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    ref = weak_ref(src)
    assert ref.data_ptr() == src.data_ptr()
    assert ref.shape == src.shape and ref.stride() == src.stride()
    ref[1, 2] = -1.0
    assert src[1, 2].item() == -1.0
    src[0, 0] = 42.0
    assert ref[0, 0].item() == 42.0


def test_keeps_strides_and_offset_of_a_view() -> None:
    base = torch.arange(20, dtype=torch.int64).reshape(4, 5)
    view = base[1:, 2:].t()
    ref = weak_ref(view)
    assert ref.data_ptr() == view.data_ptr()
    assert ref.stride() == view.stride()
    assert torch.equal(ref, view)


def test_does_not_own_the_storage() -> None:
    src = torch.ones(8)
    ref = weak_ref(src)
    # A view would share src's StorageImpl; the weak ref has its own, non-owning one.
    assert ref.untyped_storage()._cdata != src.untyped_storage()._cdata
    assert ref.untyped_storage().data_ptr() == src.untyped_storage().data_ptr()


def test_meta_implementation() -> None:
    src = torch.empty(3, 4, device="meta").t()
    ref = weak_ref(src)
    assert ref.device.type == "meta"
    assert ref.shape == (4, 3) and ref.stride() == (1, 4)


def test_usable_under_fake_tensors() -> None:
    with FakeTensorMode():
        src = torch.empty(5, 6, dtype=torch.bfloat16)
        ref = weak_ref(src)
        assert ref.shape == (5, 6) and ref.dtype == torch.bfloat16


def test_registered_for_cpu_cuda_and_meta() -> None:
    op = "vllm_kunlun::weak_ref_tensor"
    for key in ("CPU", "CUDA", "Meta"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, key), key


def test_missing_extension_is_reported_once_with_the_fix() -> None:
    # Engine start path: vLLM's _custom_ops calls the platform's import_kernels().
    proc = run_python(
        """
        import sys
        sys.modules["vllm_kunlun._native"] = None  # as if never built
        import vllm._custom_ops
        from vllm_kunlun.ops import native
        assert native.load() is False
        print("STATUS", native.status())
        """,
        env={"FAKE_XMLIR_DEVICES": "8"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = proc.stdout + proc.stderr
    assert log.count("native extension vllm_kunlun._native is not available") == 1
    assert "VLLM_KUNLUN_BUILD_EXT=1 scripts/setup.sh" in log
    assert "STATUS (False," in proc.stdout
