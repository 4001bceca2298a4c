"""The fake kunlun_ops' call records stay small: an argument beyond ``CLONE_LIMIT``
elements (a GDN state pool, a KV cache: passed whole on every call) is recorded as a
``meta`` tensor of its shape and dtype, not cloned. Cloning it made the vendor-path
demo on the default model grow to 22 GB in seconds and get OOM-killed. What the tests
read (parameters, indices, a batch's probabilities) is still cloned, values and all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch


@pytest.fixture
def ops(fake_vendor_path: Path) -> Any:
    import kunlun_ops

    kunlun_ops.reset()
    return kunlun_ops


def test_a_pool_sized_argument_is_recorded_by_shape_only(ops: Any) -> None:
    pool = torch.zeros(ops.CLONE_LIMIT + 1, dtype=torch.bfloat16)
    small = torch.arange(6, dtype=torch.int32)
    ops._record("kernel", state=pool, indices=small, flag=True)
    (call,) = ops.CALLS
    kept = call.tensors["state"]
    assert kept.device.type == "meta"
    assert kept.shape == pool.shape and kept.dtype == pool.dtype
    assert call.contiguous["state"] is True
    assert call.tensors["indices"].tolist() == list(range(6))
    assert call.tensors["indices"].data_ptr() != small.data_ptr()  # a clone
    assert call.scalars == {"flag": True}


def test_recording_many_calls_with_a_big_pool_keeps_memory_flat(ops: Any) -> None:
    pool = torch.zeros(4 * ops.CLONE_LIMIT)  # 4 MiB of float32
    for _ in range(2000):  # 8 GB if each call cloned it
        ops._record("kernel", state=pool)
    assert all(c.tensors["state"].device.type == "meta" for c in ops.CALLS)
