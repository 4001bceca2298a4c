"""The MLA seam (vllm_kunlun/ops/mla/seam.py): which path serves, and the vendor cache
write and absorbed decode through the fakes (tests/fakes/kunlun_ops/_mla.py: float64
loops) against the portable kernels, in two geometries. ``CUDA`` is a label: no tensor
is put there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import serve_platform
from vllm_kunlun.ops import chooser
from vllm_kunlun.ops.contract import VENDOR_CONTRACT
from vllm_kunlun.ops.mla import seam
from vllm_kunlun.ops.mla.metadata import MLADecode, PluginMLAMetadata
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch, kunlun_platform: object) -> Iterator[None]:
    monkeypatch.delenv("VLLM_KUNLUN_EMULATION_VENDOR", raising=False)
    seam.reset()
    yield
    seam.reset()


@pytest.fixture
def fake_ops(fake_vendor_path: Path) -> Any:
    import kunlun_ops

    kunlun_ops.reset()
    return kunlun_ops


@pytest.fixture
def emulated_vendor(fake_ops: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    serve_platform(monkeypatch, KunlunHostEmulationPlatform)
    monkeypatch.setenv("VLLM_KUNLUN_EMULATION_VENDOR", "1")
    return fake_ops


def test_mla_is_a_family_of_the_one_chooser_and_its_calls_are_declared() -> None:
    assert chooser.MLA in chooser.FAMILIES and chooser.MLA.variable is None
    declared = VENDOR_CONTRACT["kunlun_ops"]
    assert declared[seam.CACHE_KERNEL] == ()
    assert "indices" in declared[seam.DECODE_KERNEL]


def test_kunlun_device_takes_the_vendor_kernels(fake_ops: Any) -> None:
    k = seam.select_kernels(CUDA)
    assert k.name == "vendor"
    assert k.vendor == (fake_ops.concat_and_cache_mla, fake_ops.fwd_kvcache_mla)


def test_cpu_tensors_on_kunlun_run_portable(fake_ops: Any) -> None:
    k = seam.select_kernels(CPU)
    assert (k.name, k.vendor) == ("portable", None)
    assert k.reason == "the tensors are on the CPU"


def test_host_emulation_is_portable_unless_asked(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve_platform(monkeypatch, KunlunHostEmulationPlatform)
    k = seam.select_kernels(CPU)
    assert k.name == "portable"
    assert "VLLM_KUNLUN_EMULATION_VENDOR=1 takes the vendor ones" in k.reason


def test_a_library_without_the_mla_kernels_falls_back_with_the_reason(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(fake_ops, "fwd_kvcache_mla")
    k = seam.select_kernels(CUDA)
    assert k.name == "portable"
    assert "has no fwd_kvcache_mla" in k.reason


@pytest.mark.parametrize(
    "heads,latent,rope,block_size,seq_lens",
    [(4, 32, 16, 16, [1, 17, 40]), (2, 48, 8, 5, [3, 11])],
)
def test_vendor_decode_and_cache_write_equal_the_portable_kernels(
    emulated_vendor: Any,
    heads: int,
    latent: int,
    rope: int,
    block_size: int,
    seq_lens: list[int],
) -> None:
    g = torch.Generator().manual_seed(heads + latent)
    width = latent + rope
    blocks = 24
    perm = torch.randperm(blocks, generator=g)
    per = -(-max(seq_lens) // block_size)
    table = torch.stack([perm[i * per : (i + 1) * per] for i in range(len(seq_lens))])
    caches = {p: torch.zeros(blocks, block_size, width) for p in ("vendor", "portable")}
    slot_rows = []
    for b, n in enumerate(seq_lens):
        pos = torch.arange(n)
        slot_rows.append(table[b][pos // block_size] * block_size + pos % block_size)
    slots = torch.cat(slot_rows)
    slots = torch.cat([slots, torch.tensor([-1])])  # one padding token
    kv_c = torch.randn(len(slots), latent, generator=g)
    k_pe = torch.randn(len(slots), rope, generator=g)
    meta = PluginMLAMetadata(
        num_actual_tokens=len(slots),
        slot_mapping=slots,
        num_decodes=0,
        num_decode_tokens=0,
        num_prefills=0,
        decode=None,
        prefill=None,
    )
    decode_meta = MLADecode(
        block_table=table,
        seq_lens=torch.tensor(seq_lens),
        seq_lens_cpu=seq_lens,
    )
    q_latent = torch.randn(len(seq_lens), heads, latent, generator=g)
    q_pe = torch.randn(len(seq_lens), heads, rope, generator=g)
    vendor_k = seam.select_kernels(CPU)
    assert vendor_k.name == "vendor", vendor_k.reason
    portable_k = seam.MlaKernels("portable", "test")
    out = {}
    for name, k in (("vendor", vendor_k), ("portable", portable_k)):
        seam.write_cache(k, kv_c, k_pe, caches[name], meta)
        out[name] = seam.decode(
            k, q_latent, q_pe, caches[name], decode_meta, latent, 0.2
        )
    assert torch.equal(caches["vendor"], caches["portable"])
    assert caches["vendor"].abs().sum() > 0
    torch.testing.assert_close(out["vendor"], out["portable"], atol=1e-5, rtol=1e-5)
    names = [c.name for c in emulated_vendor.CALLS]
    assert names == ["concat_and_cache_mla", "fwd_kvcache_mla"]
    paths = {(s["path"], s["calls"]) for s in seam.served()}
    assert paths == {("vendor", 1), ("portable", 1)}


def test_slot_indices_mark_positions_past_each_length() -> None:
    table = torch.tensor([[3, 1, 0], [0, 2, 4]])
    got = seam.slot_indices(table, [3, 5], block_size=2)
    assert got.dtype == torch.int32 and got.shape == (2, 1, 5)
    assert got[0, 0].tolist() == [6, 7, 2, -1, -1]
    assert got[1, 0].tolist() == [0, 1, 4, 5, 8]


def test_the_decode_passes_exactly_the_declared_keywords() -> None:
    passed: dict[str, Any] = {}

    def recorder(**kwargs: Any) -> None:
        passed.update(kwargs)

    decode_meta = MLADecode(
        block_table=torch.tensor([[0, 1]]), seq_lens=torch.tensor([3]), seq_lens_cpu=[3]
    )
    kernels = seam.MlaKernels("vendor", "test", (recorder, recorder))
    cache = torch.zeros(2, 2, 6)
    seam.decode(
        kernels, torch.zeros(1, 2, 4), torch.zeros(1, 2, 2), cache, decode_meta, 4, 1.0
    )
    declared = VENDOR_CONTRACT["kunlun_ops"][seam.DECODE_KERNEL]
    assert set(passed) == set(declared)
    assert passed["indices"][0, 0].tolist() == [0, 1, 2]
