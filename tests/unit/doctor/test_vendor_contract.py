"""Doctor check 4: the declared vendor contract against a vendor module's signatures.

The broken vendor module is written into tmp_path for each test (named kunlun_ops, so it
is loaded through the package's real vendor loader), never into tests/fakes.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from vllm_kunlun.checks.finding import Context
from vllm_kunlun.doctor.vendor_contract import (
    accepted_keywords,
    check_vendor_contract,
    compare_contract,
)

BROKEN_KUNLUN_OPS = '''
"""kunlun_ops as a newer plugin source would meet it: one op renamed, one keyword
renamed, one pybind11-style builtin without an inspect signature."""

__version__ = "0.1.58"


def rmsnorm(x, weight, eps=1e-6):  # the plugin calls it rms_norm
    return x


def causal_conv1d(x, weight, bias=None, conv_states=None, activation=None):
    return x


def silu_and_mul(out, x):
    return out


class _PybindFunction:
    """Stands in for a pybind11 builtin: no __signature__, not a Python function."""

    __doc__ = (
        "fused_moe(arg0: torch.Tensor, topk_ids: torch.Tensor, "
        "renormalize: bool = False) -> None\\n\\nFused MoE."
    )

    __call__ = None  # not inspectable


fused_moe = _PybindFunction()
'''


@pytest.fixture
def vendor_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kunlun_ops", raising=False)
    yield tmp_path
    sys.modules.pop("kunlun_ops", None)


def _write(root: Path, source: str) -> None:
    pkg = root / "kunlun_ops"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(source))


CONTRACT = {
    "kunlun_ops": {
        "rms_norm": ("x", "weight", "eps"),
        "causal_conv1d": ("x", "weight", "bias", "cache_states", "activation"),
        "silu_and_mul": ("out", "x"),
        "fused_moe": ("topk_ids", "renormalise"),
    },
    "xspeedgate_ops": {},
}


def test_renamed_op_and_wrong_keywords_fail(vendor_dir: Path) -> None:
    _write(vendor_dir, BROKEN_KUNLUN_OPS)
    f = check_vendor_contract(Context(), CONTRACT, on_kunlun=True)
    assert f.status == "fail"
    assert f.details["missing"] == ["kunlun_ops.rms_norm"]
    assert f.cause.startswith("kunlun_ops 0.1.58: 1 missing op(s): kunlun_ops.rms_norm")
    mism = f.details["keyword_mismatches"]
    assert len(mism) == 2 and "2 keyword mismatch(es)" in f.cause
    assert mism[0].startswith(
        "kunlun_ops.causal_conv1d(cache_states=): no such keyword"
    )
    assert "conv_states" in mism[0]  # what it does accept is shown
    assert mism[1].startswith("kunlun_ops.fused_moe(renormalise=)")
    assert "pybind11" in mism[1]
    assert "kunlun_ops 0.1.58" in f.fix


def test_the_logs_eleven_missing_three_mismatches(vendor_dir: Path) -> None:
    _write(vendor_dir, BROKEN_KUNLUN_OPS)
    contract = {
        "kunlun_ops": {
            **{f"new_op_{i}": ("x",) for i in range(11)},
            "causal_conv1d": ("x", "weight", "conv_state", "cache_indices", "has_init"),
            "silu_and_mul": ("out", "x"),
        }
    }
    report = compare_contract(contract)
    assert len(report.missing) == 11
    assert len(report.mismatches) == 3
    f = check_vendor_contract(Context(), contract, on_kunlun=True)
    assert "11 missing op(s)" in f.cause and "3 keyword mismatch(es)" in f.cause


def test_matching_module_is_ok(vendor_dir: Path) -> None:
    _write(vendor_dir, BROKEN_KUNLUN_OPS)
    contract = {
        "kunlun_ops": {
            "rmsnorm": ("x", "weight", "eps"),
            "causal_conv1d": ("x", "conv_states"),
            "silu_and_mul": (),
            "fused_moe": ("topk_ids", "renormalize"),
        }
    }
    f = check_vendor_contract(Context(), contract, on_kunlun=True)
    assert f.status == "ok", f
    assert f.details["checked_ops"] == 4


def test_builtin_without_any_signature_is_unverifiable_not_ok(vendor_dir: Path) -> None:
    # a real C builtin with neither an inspect signature nor a docstring
    _write(
        vendor_dir,
        "import torch\ncudnn_enabled = torch._C._get_cudnn_enabled\n__version__ = '9'\n",
    )
    f = check_vendor_contract(
        Context(), {"kunlun_ops": {"cudnn_enabled": ("x",)}}, on_kunlun=True
    )
    assert f.status == "warn"
    assert f.details["unverifiable"] == ["kunlun_ops.cudnn_enabled"]


def test_real_pybind11_builtin_is_read_from_its_doc() -> None:
    # torch._C._get_tracing_state.__doc__ == "_get_tracing_state() -> ...TracingState"
    accepts = accepted_keywords(torch._C._get_tracing_state)
    assert accepts is not None
    assert accepts.source == "pybind11 signature in __doc__"
    assert accepts.names == frozenset() and not accepts.var_keyword


def test_absent_vendor_library(vendor_dir: Path) -> None:
    contract = {"kunlun_ops": {"rms_norm": ("x",)}}
    off = check_vendor_contract(Context(), contract, on_kunlun=False)
    assert off.status == "skip" and "not importable" in off.cause
    on = check_vendor_contract(Context(), contract, on_kunlun=True)
    assert on.status == "fail" and "kunlun_ops is not importable" in on.cause


def test_torch_custom_op_keywords_come_from_its_schema() -> None:
    lib = torch.library.Library("vk_doctor_test", "FRAGMENT")
    lib.define("scale(Tensor x, float factor, *, bool inplace=False) -> Tensor")
    accepts = accepted_keywords(torch.ops.vk_doctor_test.scale)
    assert accepts is not None and accepts.source == "torch op schema"
    assert accepts.names == {"x", "factor", "inplace"}
    assert not accepts.var_keyword


def test_python_kwargs_accept_anything() -> None:
    def wrapper(x, **kwargs):  # type: ignore[no-untyped-def]
        return x

    accepts = accepted_keywords(wrapper)
    assert accepts is not None and accepts.var_keyword


def test_declared_contract_is_checked_by_default() -> None:
    """The real manifest (ops/contract.py) is the default input."""
    from vllm_kunlun.ops.contract import VENDOR_CONTRACT

    f = check_vendor_contract(
        Context(), load=lambda name: (None, "absent"), on_kunlun=False
    )
    declared = sum(len(v) for v in VENDOR_CONTRACT.values())
    assert f.details["declared_ops"] == declared
    assert f.status == ("skip" if declared else "ok")
