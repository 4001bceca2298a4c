"""The device communicator of both platforms: vLLM's torch.distributed one, with
collective outputs that torch's gloo backend can write.

Why: vLLM 0.15.1's workers run the model under ``torch.inference_mode()`` (hard-coded
decorators on ``Worker.execute_model`` and the model runner; ``Platform.inference_mode()``
is never called), so every buffer they allocate is an inference tensor. torch 2.5.1's
gloo backend, host emulation's collective backend, finishes ``all_gather_into_tensor``,
``all_gather`` and ``gather`` in its own work thread by ``copy_`` into the caller's output
tensors. InferenceMode is thread-local and does not follow the work into that thread, so
the copy is an in-place update of an inference tensor outside InferenceMode and the first
logits all-gather of a tensor-parallel engine dies ("Inplace update to inference tensor
outside InferenceMode is not allowed"). ``all_reduce``, ``broadcast``, ``send`` / ``recv``
and ``reduce_scatter_tensor`` write through raw pointers and are unaffected (measured on
torch 2.5.1, see tests/unit/platforms/test_communicator.py), and so is NCCL (Kunlun), which writes on
the device stream. vLLM's CPU platform never meets this because its TP / PP groups use
vllm._C's shared-memory collectives, which cannot load on torch 2.5.1.

How: on a gloo device group, the collectives that allocate their output run with
inference mode off, so the output is a normal tensor any thread may write; the result is
the same values, and everything else vLLM's base communicator does is unchanged. On an
NCCL group the class is vLLM's base communicator as is.

Removal: when torch's gloo work threads carry the caller's thread-local state (or vLLM's
workers stop allocating collective outputs under inference mode).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from vllm.distributed.device_communicators.base_device_communicator import (
    DeviceCommunicatorBase,
)

from vllm_kunlun.logger import init_logger

logger = init_logger(__name__)

COMMUNICATOR = "vllm_kunlun.platforms.communicator.KunlunCommunicator"


@contextlib.contextmanager
def outside_inference_mode() -> Iterator[None]:
    """Tensors made here are normal tensors (and still record no autograd graph)."""
    with torch.inference_mode(False), torch.no_grad():
        yield


def group_backend(group: Any) -> str | None:
    """The torch.distributed backend of ``group`` (None when torch cannot tell)."""
    if group is None:
        return None
    try:
        return str(dist.get_backend(group))
    except (RuntimeError, ValueError):
        return None


class KunlunCommunicator(DeviceCommunicatorBase):
    """vLLM's ``DeviceCommunicatorBase``; on gloo, output buffers outside inference
    mode."""

    def __init__(
        self,
        cpu_group: dist.ProcessGroup,
        device: torch.device | None = None,
        device_group: dist.ProcessGroup | None = None,
        unique_name: str = "",
    ) -> None:
        super().__init__(cpu_group, device, device_group, unique_name)
        self.plain_outputs = group_backend(device_group) == "gloo"
        if self.plain_outputs:
            logger.debug_once(
                "vllm-kunlun: gloo device group: all_gather / gather outputs are "
                "allocated outside inference mode (gloo writes them from its own thread)"
            )

    def _output_mode(self) -> contextlib.AbstractContextManager[Any]:
        if self.plain_outputs:
            return outside_inference_mode()
        return contextlib.nullcontext()

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        with self._output_mode():
            return super().all_gather(input_, dim)

    def gather(
        self, input_: torch.Tensor, dst: int = 0, dim: int = -1
    ) -> torch.Tensor | None:
        with self._output_mode():
            return super().gather(input_, dst, dim)
