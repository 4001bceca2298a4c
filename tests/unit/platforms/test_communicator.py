"""KunlunCommunicator on a gloo group under inference mode, as vLLM's workers call it.

A one-rank gloo group in this process is enough: torch 2.5.1's gloo finishes the
all-gather in its own thread whatever the group size.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from vllm.distributed.device_communicators.base_device_communicator import (
    DeviceCommunicatorBase,
)

from vllm_kunlun.platforms.communicator import KunlunCommunicator, group_backend

INFERENCE_TENSOR_ERROR = "Inplace update to inference tensor outside InferenceMode"


@pytest.fixture(scope="module")
def world() -> Iterator[dist.ProcessGroup]:
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD  # type: ignore[misc]
    finally:
        dist.destroy_process_group()


def test_torch_gloo_cannot_write_an_inference_tensor(world: dist.ProcessGroup) -> None:
    """The torch 2.5.1 fact the communicator exists for (removal: when this fails)."""
    with torch.inference_mode():
        out, inp = torch.empty(4), torch.arange(4.0)
        with pytest.raises(RuntimeError, match=INFERENCE_TENSOR_ERROR):
            dist.all_gather_into_tensor(out, inp, group=world)
        # In-place collectives write through pointers: unaffected, left alone.
        dist.all_reduce(inp, group=world)
        dist.broadcast(inp, src=0, group=world)
    assert inp.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_vllm_base_communicator_fails_under_inference_mode(
    world: dist.ProcessGroup,
) -> None:
    """What the platforms used before: the first logits all-gather of a TP engine."""
    base = DeviceCommunicatorBase(world, device_group=world, unique_name="tp")
    with torch.inference_mode(), pytest.raises(RuntimeError, match="inference tensor"):
        base.all_gather(torch.ones(2, 3), dim=-1)


def test_all_gather_and_gather_under_inference_mode(world: dist.ProcessGroup) -> None:
    comm = KunlunCommunicator(world, device_group=world, unique_name="tp")
    assert comm.plain_outputs and group_backend(world) == "gloo"
    x = torch.arange(6.0).view(2, 3)
    with torch.inference_mode():
        gathered = comm.all_gather(x.clone(), dim=-1)
        collected = comm.gather(x.clone(), dst=0, dim=0)
        # The results flow on into inference-mode code like any tensor.
        assert (gathered * 2).is_inference()
    assert gathered.tolist() == x.tolist()
    assert collected is not None and collected.tolist() == x.tolist()
    assert not gathered.requires_grad


def test_no_device_group_keeps_vllms_behaviour(world: dist.ProcessGroup) -> None:
    comm = KunlunCommunicator(world, device_group=None, unique_name="tp")
    assert group_backend(None) is None
    assert comm.plain_outputs is False
