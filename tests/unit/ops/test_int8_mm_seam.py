"""The W8A8 int8 seam (vllm_kunlun/ops/int8/seam.py): choice, vendor calls, custom op.

The vendor path runs against tests/fakes (kunlun_ops.quant2d / matmul with absmax-style
scales, torch.ops.xspeedgate_ops.* with vLLM's _C signatures), which check their inputs
like device kernels and compute in float64 independently of the portable kernel.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from vllm_kunlun.checks.finding import Context
from vllm_kunlun.doctor.vendor_contract import check_vendor_contract
from vllm_kunlun.ops.contract import VENDOR_CONTRACT
from vllm_kunlun.ops.int8 import portable
from vllm_kunlun.ops.int8 import seam as int8_mm

CUDA = torch.device("cuda", 0)  # only a label: no tensor is put there
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh_choice(
    monkeypatch: pytest.MonkeyPatch, kunlun_platform: object
) -> Iterator[None]:
    monkeypatch.delenv("VLLM_KUNLUN_INT8_MM", raising=False)
    int8_mm.reset_selection()
    yield
    int8_mm.reset_selection()


@pytest.fixture
def fakes(fake_vendor_path: Path) -> Any:
    import kunlun_ops
    import xspeedgate_ops

    kunlun_ops.reset()
    xspeedgate_ops.reset()
    return kunlun_ops, xspeedgate_ops


def test_cpu_tensors_use_the_portable_kernel(fakes: Any) -> None:
    kernels = int8_mm.select_kernels(CPU)
    assert (kernels.name, kernels.reason) == ("portable", "the tensors are on the CPU")


def test_a_device_uses_the_vendor_kernels_when_all_are_there(fakes: Any) -> None:
    kernels = int8_mm.select_kernels(CUDA)
    assert kernels.name == "vendor" and kernels.vendor_ops is not None
    assert kernels.vendor_ops.matmul is fakes[0].matmul


def test_missing_vendor_library_falls_back_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "kunlun_ops", None)  # import fails
    kernels = int8_mm.select_kernels(CUDA)
    assert kernels.name == "portable"
    assert kernels.reason.startswith("kunlun_ops is not importable")


def test_a_missing_op_is_named(fakes: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(fakes[0], "quant2d")
    kernels = int8_mm.select_kernels(CUDA)
    assert kernels.name == "portable"
    assert "kunlun_ops (0.1.58) has no quant2d" in kernels.reason
    assert "kunlun_ops 0.1.58" in kernels.reason


def test_vendor_demanded_but_absent_fails_with_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "kunlun_ops", None)
    monkeypatch.setenv("VLLM_KUNLUN_INT8_MM", "vendor")
    with pytest.raises(RuntimeError, match="VLLM_KUNLUN_INT8_MM=auto"):
        int8_mm.select_kernels(CUDA)


def test_portable_demanded(fakes: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_INT8_MM", "portable")
    assert int8_mm.select_kernels(CUDA).name == "portable"


def test_the_choice_is_made_once_per_device(
    fakes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = int8_mm.select_kernels(CUDA)
    monkeypatch.setenv("VLLM_KUNLUN_INT8_MM", "portable")
    assert int8_mm.select_kernels(CUDA) is first


# ---- the vendor path through the fakes ---------------------------------------------------


def _spy(fn: Callable[..., Any], calls: list[tuple[str, tuple, dict]], name: str):
    def call(*args: Any, **kwargs: Any) -> Any:
        calls.append((name, args, kwargs))
        return fn(*args, **kwargs)

    return call


def _layer(scheme: str, n: int = 24, k: int = 40) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(3)
    w = torch.randint(-127, 128, (n, k), generator=gen).to(torch.int8)
    args: dict[str, Any] = {
        "weight": w,
        "weight_scale": torch.rand(n, generator=gen) / 50 + 1e-3,
        "bias": torch.randn(n, generator=gen),
    }
    if scheme.startswith("static"):
        args["input_scale"] = torch.tensor(0.04)
    if scheme == "static_azp":
        args["input_zero_point"] = torch.tensor(-5, dtype=torch.int32)
        args["azp_adj"] = w.sum(1, dtype=torch.int32) * -5
    if scheme == "dynamic_azp":
        args["azp_adj"] = w.sum(1, dtype=torch.int32)
    return args


VENDOR_CALLS = {
    "dynamic": ["quant2d", "matmul"],
    "static": ["static_scaled_int8_quant", "matmul"],
    "dynamic_azp": ["dynamic_scaled_int8_quant", "cutlass_scaled_mm_azp"],
    "static_azp": ["static_scaled_int8_quant", "cutlass_scaled_mm_azp"],
}


@pytest.mark.parametrize("scheme", list(VENDOR_CALLS))
def test_vendor_path_computes_the_portable_result(fakes: Any, scheme: str) -> None:
    kunlun, _ = fakes
    found, _ = int8_mm.load_vendor()
    assert found is not None
    calls: list[tuple[str, tuple, dict]] = []
    spied = int8_mm.VendorInt8(
        _spy(kunlun.quant2d, calls, "quant2d"),
        _spy(kunlun.matmul, calls, "matmul"),
        {n: _spy(f, calls, n) for n, f in found.xspeedgate.items()},
    )
    args = _layer(scheme)
    x = torch.randn(2, 3, 40, generator=torch.Generator().manual_seed(4)) * 2
    x[0, 0] = 0  # an all-zero token
    got = spied.linear(
        x,
        args["weight"],
        args["weight_scale"],
        args.get("input_scale"),
        args.get("input_zero_point"),
        args.get("azp_adj"),
        args["bias"],
    )
    want = portable.int8_linear(x, **args)
    assert [c[0] for c in calls] == VENDOR_CALLS[scheme]
    assert got.shape == want.shape == (2, 3, 24) and got.dtype == x.dtype
    # Two implementations of the same rounding (float64 in the fakes): equal up to
    # float rounding, and a mis-wired scale (absmax vs scale) would be off by 127x.
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for name, _, kwargs in calls:
        if name in VENDOR_CONTRACT["kunlun_ops"]:
            assert set(kwargs) == set(VENDOR_CONTRACT["kunlun_ops"][name]), name
        else:
            assert name in VENDOR_CONTRACT["xspeedgate_ops"] and not kwargs, name


def test_matmul_gets_absmax_style_scales(fakes: Any) -> None:
    kunlun, _ = fakes
    args = _layer("dynamic")
    x = torch.tensor([[1.0] * 39 + [-2.5]])
    int8_mm.select_kernels(CUDA).linear(x, args["weight"], args["weight_scale"])
    (quant, mm) = kunlun.CALLS
    assert (quant.name, mm.name) == ("quant2d", "matmul")
    assert mm.tensors["x_pc_max"].item() == 2.5  # the token's absmax, not 2.5 / 127
    assert torch.allclose(
        mm.tensors["w_pc_max"].reshape(-1), args["weight_scale"] * 127.0
    )
    assert mm.scalars["out_dtype"] == torch.float32


def test_every_vendor_op_is_declared_and_the_doctor_finds_them(fakes: Any) -> None:
    for name in int8_mm.KUNLUN_OPS:
        assert name in VENDOR_CONTRACT["kunlun_ops"]
    for name in int8_mm.XSPEEDGATE_OPS:
        assert name in VENDOR_CONTRACT["xspeedgate_ops"]
    ours = {
        "kunlun_ops": {n: VENDOR_CONTRACT["kunlun_ops"][n] for n in int8_mm.KUNLUN_OPS},
        "xspeedgate_ops": {n: () for n in int8_mm.XSPEEDGATE_OPS},
    }
    f = check_vendor_contract(Context(), ours, on_kunlun=True)
    assert f.status == "ok", f
    assert f.details["checked_ops"] == 5
    # an op the xspeedgate library did not register is missing, not crashed on
    f = check_vendor_contract(
        Context(), {"xspeedgate_ops": {"no_such_op": ()}}, on_kunlun=True
    )
    assert f.status == "fail" and f.details["missing"] == ["xspeedgate_ops.no_such_op"]


# ---- one custom op, opaque to torch.compile ----------------------------------------------


def test_custom_op_equals_the_kernel_and_compiles_without_graph_breaks() -> None:
    op = int8_mm.register_op()
    assert int8_mm.register_op() is op  # defined once per process
    args = _layer("dynamic")
    x = torch.randn(5, 40)

    def f(t: torch.Tensor) -> torch.Tensor:
        out = op(t, args["weight"], args["weight_scale"], None, None, None, None)
        return out * 2.0

    want = portable.int8_linear(x, args["weight"], args["weight_scale"]) * 2.0
    torch.testing.assert_close(f(x), want)
    compiled = torch.compile(f, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), want)
