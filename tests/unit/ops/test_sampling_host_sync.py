"""The sampler's decode path never synchronises with the host (graph- and async-safe).

``KunlunTopKTopPSampler.forward`` (sample/topk_topp.py -> ops/sampling/seam.py ->
ops/sampling/portable.py) runs on ``meta`` tensors under a dispatch mode that fails on
every operation that needs the host to wait for the device: reading a value
(``.item()``, ``bool()``, ``.tolist()``: ``aten._local_scalar_dense``), outputs whose
shape depends on data (``nonzero``, boolean-mask indexing, ``masked_select``,
``unique``), copies to the CPU (``.cpu()``) and any tensor created on the CPU per step.
``meta`` tensors have shapes and no data, so the code takes its accelerator branches
(it skips work by reading masks only on the CPU) and anything that would read data
fails even without the mode. ``exponential_`` is refused too: it has no Kunlun kernel.

Not covered: rows with their own ``torch.Generator`` (seeded requests draw one small
``uniform_`` per row with it; generators cannot live on ``meta``), and the vendor
kernel itself (not available here; ops/sampling/seam.py calls it without reading results).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vllm_kunlun.ops.sampling import flashinfer_api, portable
from vllm_kunlun.ops.sampling.topk_topp import KunlunTopKTopPSampler

aten = torch.ops.aten
DEVICE = torch.device("meta")
BATCH, VOCAB = (
    256,
    151_936,
)  # the deployment log's decode step (docs/deployment-log.md D11)

_SYNC_OPS = {
    aten._local_scalar_dense.default: ".item() / bool() / int() / .tolist()",
    aten.nonzero.default: "nonzero (data-dependent shape)",
    aten.masked_select.default: "masked_select (data-dependent shape)",
    aten._unique2.default: "unique (data-dependent shape)",
    aten.unique_consecutive.default: "unique_consecutive (data-dependent shape)",
    aten.repeat_interleave.Tensor: "repeat_interleave by a tensor",
    aten.exponential_.default: "exponential_ (no Kunlun kernel: runs on the CPU)",
}
_INDEX_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}


class HostSync(AssertionError):
    pass


class NoHostSync(TorchDispatchMode):
    """Fail on any op that would wait for the device or create a CPU tensor."""

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        why = _SYNC_OPS.get(func)
        if func in _INDEX_OPS and any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
            for i in args[1]
        ):
            why = "boolean-mask indexing (data-dependent shape)"
        if func in (aten._to_copy.default, aten.copy_.default):
            target = kwargs.get("device") if func is aten._to_copy.default else None
            if func is aten.copy_.default:
                target = args[0].device
            if target is not None and torch.device(target).type == "cpu":
                why = "a copy to the CPU"
        if why is None:
            out = func(*args, **kwargs)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            if any(
                isinstance(o, torch.Tensor) and o.device.type == "cpu" for o in outs
            ):
                why = f"a CPU tensor created per step ({func})"
            else:
                return out
        stack = "".join(traceback.format_stack(limit=10)[:-2])
        raise HostSync(f"host sync in the decode path: {why} ({func})\n{stack}")


def run_without_sync(fn: Callable[[], Any]) -> Any:
    with NoHostSync():
        return fn()


@pytest.fixture(autouse=True)
def portable_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_SAMPLER", "portable")


# ---- the detector catches what it must -----------------------------------------------

_SYNCS: dict[str, Callable[[torch.Tensor], Any]] = {
    "item": lambda x: x.sum().item(),
    "bool": lambda x: bool((x > 0).any()),
    "tolist": lambda x: x[0, :3].tolist(),
    "nonzero": lambda x: x.nonzero(),
    "mask index": lambda x: x[x > 0],
    "where one arg": lambda x: torch.where(x > 0),
    "cpu copy": lambda x: x.cpu(),
    "to cpu": lambda x: x.to("cpu"),
    "cpu tensor": lambda x: torch.tensor([1.0, 2.0]),
    "cpu factory": lambda x: torch.zeros(x.shape[0]),
    "exponential": lambda x: torch.empty_like(x).exponential_(),
}


@pytest.mark.parametrize("name", sorted(_SYNCS))
def test_detector_catches(name: str) -> None:
    x = torch.empty(4, 8, device=DEVICE)
    with pytest.raises((HostSync, NotImplementedError, RuntimeError)) as info:
        run_without_sync(lambda: _SYNCS[name](x))
    assert info.type is HostSync, info.value


def test_detector_lets_device_work_through() -> None:
    x = torch.empty(4, 8, device=DEVICE)
    out = run_without_sync(lambda: torch.where(x > 0, x, 0.0).topk(3).indices + 1)
    assert out.device == DEVICE and out.shape == (4, 3)


# ---- the sampler's decode path ------------------------------------------------------


def _rows(kind: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Per-row top-k / top-p tensors as vLLM's SamplingMetadata holds them."""
    k = torch.empty(BATCH, dtype=torch.int64, device=DEVICE)
    p = torch.empty(BATCH, dtype=torch.float32, device=DEVICE)
    return {
        "none": (None, None),
        "top_k": (k, None),
        "top_p": (None, p),
        "top_k_top_p": (k, p),
    }[kind]


@pytest.mark.parametrize(
    "mode", ["raw_logprobs", "processed_logprobs", "processed_logits"]
)
@pytest.mark.parametrize("kind", ["none", "top_k", "top_p", "top_k_top_p"])
def test_sampler_forward_has_no_host_sync(kind: str, mode: str) -> None:
    logits = torch.empty(BATCH, VOCAB, device=DEVICE)
    k, p = _rows(kind)
    sampler = KunlunTopKTopPSampler(mode)
    tokens, processed = run_without_sync(lambda: sampler.forward(logits, {}, k, p))
    assert tokens.shape == (BATCH,) and tokens.device == DEVICE
    assert (processed is None) == (mode == "raw_logprobs")
    assert sampler.kernels(DEVICE).name == "portable"


@pytest.mark.parametrize("kind", ["top_k", "top_p", "top_k_top_p"])
def test_apply_top_k_top_p_has_no_host_sync(kind: str) -> None:
    # vLLM calls it as the sampler's apply_top_k_top_p (logprobs of processed logits).
    logits = torch.empty(BATCH, VOCAB, device=DEVICE)
    k, p = _rows(kind)
    out = run_without_sync(lambda: portable.mask_logits(logits, k, p))
    assert out.shape == (BATCH, VOCAB)


def test_flashinfer_entry_points_have_no_host_sync() -> None:
    probs = torch.empty(BATCH, VOCAB, device=DEVICE)
    k = torch.empty(BATCH, dtype=torch.int32, device=DEVICE)
    p = torch.empty(BATCH, dtype=torch.float32, device=DEVICE)
    for fn in (
        flashinfer_api.top_k_top_p_sampling_from_probs,
        flashinfer_api.top_k_top_p_sampling_from_logits,
    ):
        out = run_without_sync(lambda fn=fn: fn(probs, k, p))
        assert out.shape == (BATCH,) and out.dtype == torch.int32
