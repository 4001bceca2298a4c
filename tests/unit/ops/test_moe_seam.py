"""The MoE seam (vllm_kunlun/ops/moe/seam.py): which path serves, the vendor block
through the fake (tests/fakes/kunlun_ops/_moe.py, transformers' semantics in a plain
loop), the fallbacks for int8 experts and expert parallelism, and the one custom op
torch.compile sees. ``CUDA`` is a label: no tensor is put there."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import serve_platform
from tests.unit.ops.moe_cases import block, inputs, quantize_rows, weights
from vllm_kunlun.checks.finding import Context
from vllm_kunlun.doctor.vendor_contract import check_vendor_contract
from vllm_kunlun.ops import chooser
from vllm_kunlun.ops.contract import VENDOR_CONTRACT
from vllm_kunlun.ops.moe import portable
from vllm_kunlun.ops.moe import seam as moe
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch, kunlun_platform: object) -> Iterator[None]:
    monkeypatch.delenv("VLLM_KUNLUN_EMULATION_VENDOR", raising=False)
    moe.reset()
    yield
    moe.reset()


@pytest.fixture
def fake_ops(fake_vendor_path: Path) -> Any:
    import kunlun_ops

    kunlun_ops.reset()
    return kunlun_ops


@pytest.fixture
def emulated_vendor(fake_ops: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Host emulation asked for the vendor kernels, with the fakes importable: the
    vendor path runs on CPU tensors."""
    serve_platform(monkeypatch, KunlunHostEmulationPlatform)
    monkeypatch.setenv("VLLM_KUNLUN_EMULATION_VENDOR", "1")
    return fake_ops


def _layer(e: int = 16, k: int = 4, h: int = 32, i: int = 16, t: int = 7) -> Any:
    m = block(e, k, h, i)
    return m, inputs(t, h), *weights(m)


# ---- the choice -----------------------------------------------------------------------


def test_moe_is_a_family_of_the_one_chooser_without_a_switch() -> None:
    assert chooser.MOE in chooser.FAMILIES and chooser.MOE.variable is None


def test_cpu_tensors_on_kunlun_use_the_portable_kernel(fake_ops: Any) -> None:
    k = moe.select_kernels(CPU)
    assert (k.name, k.reason) == ("portable", "the tensors are on the CPU")


def test_kunlun_device_takes_the_vendor_block(fake_ops: Any) -> None:
    k = moe.select_kernels(CUDA)
    assert k.name == "vendor" and k.vendor is fake_ops.moe_ffn_block
    assert k.reason == "kunlun_ops.moe_ffn_block is available"


def test_missing_vendor_library_falls_back_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "kunlun_ops", None)
    k = moe.select_kernels(CUDA)
    assert k.name == "portable" and k.reason.startswith("kunlun_ops is not importable")


def test_a_library_without_the_block_is_named(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(fake_ops, "moe_ffn_block")
    k = moe.select_kernels(CUDA)
    assert k.name == "portable" and "has no moe_ffn_block" in k.reason


def test_host_emulation_takes_the_vendor_block_only_with_its_switch(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve_platform(monkeypatch, KunlunHostEmulationPlatform)
    k = moe.select_kernels(CPU)
    assert k.name == "portable"
    assert "VLLM_KUNLUN_EMULATION_VENDOR=1 takes the vendor ones" in k.reason
    moe.reset()
    monkeypatch.setenv("VLLM_KUNLUN_EMULATION_VENDOR", "1")
    assert moe.select_kernels(CPU).name == "vendor"


def test_the_choice_is_made_and_logged_once_per_device(
    fake_ops: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="vllm")
    device = torch.device("meta")  # a device no other MoE test logs a choice for
    first = moe.select_kernels(device)
    assert moe.select_kernels(device) is first
    for _ in range(2):
        moe.reset()
        assert moe.select_kernels(device).name == "portable"
    lines = [
        r.getMessage() for r in caplog.records if "MoE kernels on" in r.getMessage()
    ]
    assert lines == [
        "vllm-kunlun: MoE kernels on meta: portable (the tensors are on meta, the "
        "platform runs on cuda)"
    ]


# ---- the paths ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("e", "k", "h", "i", "t"),
    [(8, 2, 32, 16, 1), (16, 4, 64, 48, 33), (64, 8, 32, 16, 7)],
)
@pytest.mark.parametrize("renormalize", [True, False])
def test_the_vendor_block_computes_the_portable_result(
    emulated_vendor: Any, e: int, k: int, h: int, i: int, t: int, renormalize: bool
) -> None:
    _, x, router, w13, w2 = _layer(e, k, h, i, t)
    got = moe.moe_forward(x, router, w13, w2, top_k=k, renormalize=renormalize)
    want = portable.moe_forward(x, router, w13, w2, top_k=k, renormalize=renormalize)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    (call,) = [c for c in emulated_vendor.CALLS if c.name == "moe_ffn_block"]
    assert set(call.args) == set(VENDOR_CONTRACT["kunlun_ops"]["moe_ffn_block"])
    assert call.args["expert_num"] == e and call.args["moe_top_k"] == k
    assert call.args["renormalize"] is renormalize
    assert call.args["use_grouped_topk"] is False
    assert call.args["gate_w"]["shape"] == [e, h]
    assert call.args["inter_w"]["shape"] == [e, 2 * i, h]
    assert call.args["output_w"]["shape"] == [e, h, i]
    (served,) = moe.served()
    assert (served["path"], served["calls"]) == ("vendor", 1)


def test_the_vendor_block_in_bf16(emulated_vendor: Any) -> None:
    m, x, *_ = _layer(16, 4, 64, 48, 33)
    m = m.to(torch.bfloat16)
    router, w13, w2 = weights(m)
    x = x.to(torch.bfloat16)
    got = moe.moe_forward(x, router, w13, w2, top_k=4, renormalize=True)
    want = portable.moe_forward(x, router, w13, w2, top_k=4, renormalize=True)
    assert got.dtype == torch.bfloat16
    scale = want.float().abs().max().item()
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=1e-2 * scale)


def test_int8_experts_fall_back_to_portable_with_the_reason(
    emulated_vendor: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="vllm")
    _, x, router, w13, w2 = _layer()
    q13, s13 = quantize_rows(w13)
    q2, s2 = quantize_rows(w2)
    for _ in range(2):
        got = moe.moe_forward(
            x, router, q13, q2, top_k=4, renormalize=True, w13_scale=s13, w2_scale=s2
        )
    want = portable.moe_forward(
        x, router, q13, q2, top_k=4, renormalize=True, w13_scale=s13, w2_scale=s2
    )
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not [c for c in emulated_vendor.CALLS if c.name == "moe_ffn_block"]
    (served,) = moe.served()
    assert served["path"] == "portable" and served["calls"] == 2
    assert served["reason"] == "int8 experts: moe_ffn_block takes no weight scales"
    logged = [
        r.getMessage() for r in caplog.records if "int8 experts" in r.getMessage()
    ]
    assert len(logged) == 1 and "not the vendor moe_ffn_block" in logged[0]


@pytest.mark.parametrize("slices", [2, 4])
def test_expert_parallel_slices_fall_back_to_portable_and_sum_to_the_whole(
    emulated_vendor: Any, slices: int
) -> None:
    _, x, router, w13, w2 = _layer(16, 4, 32, 16, 33)
    full = moe.moe_forward(x, router, w13, w2, top_k=4, renormalize=True)
    per = 16 // slices
    parts = [
        moe.moe_forward(
            x,
            router,
            w13[r * per : (r + 1) * per],
            w2[r * per : (r + 1) * per],
            top_k=4,
            renormalize=True,
            expert_start=r * per,
            num_experts=16,
        )
        for r in range(slices)
    ]
    torch.testing.assert_close(sum(parts), full, rtol=1e-5, atol=1e-5)
    paths = {s["path"]: s for s in moe.served()}
    assert paths["vendor"]["calls"] == 1
    assert paths["portable"]["calls"] == slices
    assert paths["portable"]["reason"].startswith(
        f"expert parallelism ({per} of 16 experts on this rank)"
    )


def test_the_doctor_finds_the_declared_call_in_the_fake(fake_ops: Any) -> None:
    ours = {
        "kunlun_ops": {"moe_ffn_block": VENDOR_CONTRACT["kunlun_ops"]["moe_ffn_block"]}
    }
    f = check_vendor_contract(Context(), ours, on_kunlun=True)
    assert f.status == "ok", f
    assert f.details["checked_ops"] == 1


# ---- one custom op, opaque to torch.compile -------------------------------------------


def test_custom_op_is_registered_once_and_has_a_fake_implementation() -> None:
    op = moe.register_op()
    assert moe.register_op() is op
    assert op is torch.ops.vllm_kunlun.moe_forward
    _, x, router, w13, w2 = _layer()
    args = (x, router, w13, w2, 4, True, 0, 16, None, None)
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if torch.is_tensor(a) else a for a in args]
        out = op(*fake_args)
    assert out.shape == x.shape and out.dtype == x.dtype


@pytest.mark.parametrize("fullgraph", [True, False])
def test_custom_op_compiles_as_one_opaque_op(fullgraph: bool) -> None:
    _, x, router, w13, w2 = _layer(16, 4, 32, 16, 9)

    def layer(t: torch.Tensor) -> torch.Tensor:
        y = moe.moe_forward(t, router, w13, w2, top_k=4, renormalize=True)
        return F.silu(y) + t

    want = layer(x)
    compiled = torch.compile(layer, backend="eager", fullgraph=fullgraph)
    torch.testing.assert_close(compiled(x), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(compiled(inputs(3, 32)), layer(inputs(3, 32)))


def test_the_serving_report_lists_what_served_the_moe_layers() -> None:
    from vllm_kunlun.demo import serving_info

    _, x, router, w13, w2 = _layer()
    moe.moe_forward(x, router, w13, w2, top_k=4, renormalize=True)
    moe.moe_forward(x, router, w13, w2, top_k=4, renormalize=True)
    assert serving_info._moe_kernels() == [
        {
            "device": "cpu",
            "path": "portable",
            "reason": "the tensors are on the CPU",
            "calls": 2,
        }
    ]
