"""The LoRA kernels (vllm_kunlun/ops/lora/): the portable batched kernels, the vendor
path through the fake bgmv kernels, and the punica wrapper on vLLM's own LoRAMapping,
all against a token-by-token float64 reference written here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from vllm.lora.layers import LoRAMapping

from tests.conftest import serve_platform
from vllm_kunlun.ops.lora import portable, seam
from vllm_kunlun.ops.lora.punica import PunicaWrapperKunlun
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("VLLM_KUNLUN_EMULATION_VENDOR", raising=False)
    serve_platform(monkeypatch, KunlunHostEmulationPlatform)
    seam.reset()
    yield
    seam.reset()


def reference(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    slots: list[int],
    scale: float,
) -> torch.Tensor:
    """Per token: ``scale * x @ A[slot]^T @ B[slot]^T``, zero for slot -1."""
    out = torch.zeros(x.shape[0], b.shape[-2], dtype=torch.float64)
    for t, slot in enumerate(slots):
        if slot >= 0:
            a_s, b_s = a[slot, 0].double(), b[slot, 0].double()
            out[t] = scale * (x[t].double() @ a_s.t()) @ b_s.t()
    return out


def stacked(
    slots: int, rank: int, k: int, n: int, seed: int
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(slots, 1, rank, k, generator=g)
    b = torch.randn(slots, 1, n, rank, generator=g)
    return a, b


SHAPES = [  # (tokens, slots, rank, in, out, per-token slots)
    (5, 2, 8, 16, 24, [0, 1, -1, 1, 0]),
    (7, 4, 16, 32, 8, [3, 3, -1, -1, 2, 0, 1]),
    (3, 1, 64, 48, 40, [-1, -1, -1]),
    (1, 3, 8, 8, 8, [2]),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"T{s[0]}-L{s[1]}-r{s[2]}")
def test_portable_shrink_expand_match_the_per_token_reference(shape: tuple) -> None:
    t, slots, rank, k, n, per_token = shape
    a, b = stacked(slots, rank, k, n, seed=t)
    x = torch.randn(t, k, generator=torch.Generator().manual_seed(1))
    idx = torch.tensor(per_token, dtype=torch.long)
    h = portable.bgmv_shrink(x, a, idx, 0.5)
    assert h.shape == (t, rank) and h.dtype == torch.float32
    got = portable.bgmv_expand(h, b, idx)
    want = reference(x, a, b, per_token, 0.5)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-3)
    for row, slot in enumerate(per_token):
        if slot < 0:
            assert not got[row].any()


@pytest.mark.parametrize("shape", SHAPES[:2], ids=lambda s: f"T{s[0]}-L{s[1]}")
def test_vendor_path_via_the_fake_bgmv_kernels(
    shape: tuple, fake_vendor_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import xspeedgate_ops

    xspeedgate_ops.reset()
    monkeypatch.setenv("VLLM_KUNLUN_EMULATION_VENDOR", "1")
    t, slots, rank, k, n, per_token = shape
    a, b = stacked(slots, rank, k, n, seed=3)
    x = torch.randn(t, k, generator=torch.Generator().manual_seed(2))
    idx = torch.tensor(per_token, dtype=torch.long)
    got = seam.lora_expand(seam.lora_shrink(x, a, idx, 2.0), b, idx)
    torch.testing.assert_close(
        got.double(), reference(x, a, b, per_token, 2.0), rtol=1e-4, atol=1e-3
    )
    names = [name for name, _ in xspeedgate_ops.CALLS]
    assert names == ["bgmv_shrink_cluster", "bgmv_expand_cluster"]
    assert [s["path"] for s in seam.served()] == ["vendor"]


def test_emulation_without_its_switch_runs_portable() -> None:
    a, b = stacked(2, 8, 16, 16, seed=0)
    x = torch.randn(3, 16)
    idx = torch.tensor([1, -1, 0])
    seam.lora_expand(seam.lora_shrink(x, a, idx, 1.0), b, idx)
    (entry,) = seam.served()
    assert entry["path"] == "portable"
    assert "VLLM_KUNLUN_EMULATION_VENDOR=1" in entry["reason"]


@pytest.mark.parametrize("prefill", [True, False])
def test_punica_wrapper_applies_each_requests_adapter_per_slice(prefill: bool) -> None:
    # Three requests: adapter id 7 (slot 1), none, adapter id 3 (slot 0); QKV-like
    # slices of different widths written into one output.
    tokens_per_request = [3, 2, 1] if prefill else [1, 1, 1]
    ids = [7, 0, 3]
    index_mapping = [
        i for i, n in zip(ids, tokens_per_request, strict=True) for _ in range(n)
    ]
    wrapper = PunicaWrapperKunlun(64, 8, device="cpu")
    wrapper.update_metadata(
        LoRAMapping(index_mapping, index_mapping, is_prefill=prefill),
        lora_index_to_id=[3, 7],
        max_loras=2,
        vocab_size=100,
    )
    slot_of = {7: 1, 0: -1, 3: 0}
    slots = [slot_of[i] for i in index_mapping]
    k, rank, sizes = 12, 4, (8, 4, 4)
    stacks = [stacked(2, rank, k, n, seed=i) for i, n in enumerate(sizes)]
    x = torch.randn(len(slots), k)
    y0 = torch.randn(len(slots), sum(sizes))
    y = y0.clone()
    wrapper.add_lora_linear(
        y, x, tuple(s[0] for s in stacks), tuple(s[1] for s in stacks), 0.25, sizes
    )
    want = torch.cat([reference(x, a, b, slots, 0.25) for a, b in stacks], dim=1)
    torch.testing.assert_close((y - y0).double(), want, rtol=1e-4, atol=1e-4)
