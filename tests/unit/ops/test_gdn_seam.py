"""The GDN kernel seam (vllm_kunlun/ops/gdn/seam.py): which kernel runs, and why, per op.

Calls go through ``dispatcher(op, vllm_function)`` with vLLM 0.15.1's own kernels as the
"Triton" originals, so the seam binds the arguments exactly as ``qwen3_next`` passes
them. The vendor path runs against tests/fakes/kunlun_ops (transformers' recurrence
behind the vendor signature); no tensor is ever put on a device (``CUDA`` is a label).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm.model_executor.models import qwen3_next

from vllm_kunlun.ops.contract import VENDOR_CONTRACT
from vllm_kunlun.ops.gdn import portable as gdn_portable
from vllm_kunlun.ops.gdn import seam as gdn

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch: pytest.MonkeyPatch, kunlun_platform: object) -> Any:
    monkeypatch.delenv("VLLM_KUNLUN_GDN", raising=False)
    gdn.reset()
    yield
    gdn.reset()


@pytest.fixture
def fake_ops(fake_vendor_path: Path) -> Any:
    import kunlun_ops

    kunlun_ops.reset()
    return kunlun_ops


@pytest.fixture
def no_vendor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kunlun_ops", None)  # import fails


def _decode_inputs(seed: int = 0) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    n, h, hv, dk, dv = 3, 2, 4, 16, 8
    return {
        "q": torch.randn(1, n, h, dk, generator=gen),
        "k": torch.randn(1, n, h, dk, generator=gen),
        "v": torch.randn(1, n, hv, dv, generator=gen),
        "g": -torch.rand(1, n, hv, generator=gen),
        "beta": torch.rand(1, n, hv, generator=gen),
        "pool": torch.randn(6, hv, dk, dv, generator=gen),
        "cu": torch.arange(n + 1, dtype=torch.int32),
        "slots": torch.tensor([4, 1, 2], dtype=torch.int32),
    }


def _recurrent(route: Any, x: dict[str, Any], pool: torch.Tensor) -> torch.Tensor:
    # As Qwen3NextGatedDeltaNet._forward_core calls it on the decode path.
    out, final = route(
        q=x["q"],
        k=x["k"],
        v=x["v"],
        g=x["g"],
        beta=x["beta"],
        initial_state=pool,
        inplace_final_state=True,
        cu_seqlens=x["cu"],
        ssm_state_indices=x["slots"],
        use_qk_l2norm_in_kernel=True,
    )
    assert final is pool
    return out


def _portable(x: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The portable recurrence on a copy of the pool: (output, pool after)."""
    pool = x["pool"].clone()
    out = gdn_portable.recurrent_gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], x["beta"], 16**-0.5, pool, x["cu"], x["slots"]
    )
    return out, pool


# ---- the choice -------------------------------------------------------------------------


def test_cpu_tensors_use_the_portable_kernels(fake_ops: Any) -> None:
    for op in gdn.OPS:
        choice = gdn.choose(op, CPU)
        assert (choice.name, choice.reason) == (
            "portable",
            "the tensors are on the CPU",
        )


def test_auto_uses_the_vendor_decode_kernel_on_a_device(fake_ops: Any) -> None:
    choice = gdn.choose("fused_recurrent_gated_delta_rule", CUDA)
    assert choice.name == "vendor"
    assert (
        "kunlun_ops.fused_recurrent_gated_delta_rule_fwdv2 is available"
        in choice.reason
    )
    # No vendor kernel is wired for the prefill ops; without Triton they are portable.
    chunk = gdn.choose("chunk_gated_delta_rule", CUDA)
    assert chunk.name == "portable"
    assert "no vendor kernel is wired for chunk_gated_delta_rule" in chunk.reason
    assert "Triton has no active driver" in chunk.reason


def test_auto_prefers_triton_over_portable_when_it_has_a_driver(
    no_vendor: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gdn, "triton_driver", lambda: (True, "Triton has a driver"))
    choice = gdn.choose("fused_recurrent_gated_delta_rule", CUDA)
    assert choice.name == "triton"
    assert choice.reason.startswith("Triton has a driver; kunlun_ops is not importable")


def test_explicit_modes(fake_ops: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_GDN", "portable")
    assert gdn.choose("fused_recurrent_gated_delta_rule", CUDA).name == "portable"
    gdn.reset()
    monkeypatch.setenv("VLLM_KUNLUN_GDN", "vendor")
    assert gdn.choose("fused_recurrent_gated_delta_rule", CPU).name == "vendor"
    assert gdn.choose("causal_conv1d_fn", CPU).name == "portable"


def test_vendor_mode_without_the_kernel_names_the_fix(
    no_vendor: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_GDN", "vendor")
    with pytest.raises(RuntimeError, match="VLLM_KUNLUN_GDN=auto") as err:
        gdn.choose("fused_recurrent_gated_delta_rule", CUDA)
    assert "kunlun_ops is not importable" in str(err.value)


def test_triton_mode_without_a_driver_names_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_GDN", "triton")
    with pytest.raises(RuntimeError, match="Triton has no active driver"):
        gdn.choose("chunk_gated_delta_rule", CUDA)


def test_a_bad_mode_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_GDN", "fla")
    with pytest.raises(ValueError, match="VLLM_KUNLUN_GDN='fla' is not valid"):
        gdn.choose("chunk_gated_delta_rule", CPU)


def test_each_choice_is_logged_once(
    fake_ops: Any, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    caplog.set_level(logging.INFO, logger="vllm")
    meta = torch.device("meta")  # a device no other test logs a choice for
    for _ in range(3):
        gdn.reset()
        gdn.choose("causal_conv1d_update", meta)
    lines = [
        r.getMessage()
        for r in caplog.records
        if "GDN kernel causal_conv1d_update on meta" in r.getMessage()
    ]
    assert len(lines) == 1
    assert ": portable (" in lines[0] and "no vendor kernel is wired" in lines[0]


# ---- the calls --------------------------------------------------------------------------


def test_dispatch_binds_vllms_signature_and_runs_portable() -> None:
    route = gdn.dispatcher(
        "fused_recurrent_gated_delta_rule", qwen3_next.fused_recurrent_gated_delta_rule
    )
    x = _decode_inputs()
    pool = x["pool"].clone()
    out = _recurrent(route, x, pool)
    expected, expected_pool = _portable(x)
    assert torch.equal(out, expected) and torch.equal(pool, expected_pool)
    assert route.__wrapped__ is qwen3_next.fused_recurrent_gated_delta_rule


@pytest.mark.parametrize(
    "op", ["fused_gdn_gating", "causal_conv1d_update", "chunk_gated_delta_rule"]
)
def test_call_arguments_map_as_python_binds_them(op: str) -> None:
    """The seam reads vLLM's signature once; each call maps to the same names and
    defaults that ``inspect.Signature.bind`` + ``apply_defaults`` give."""
    import inspect

    fn = getattr(qwen3_next, op)
    signature = inspect.signature(fn)
    names = list(signature.parameters)
    arguments_of = gdn._arguments_of(fn)
    required = [
        n
        for n, p in signature.parameters.items()
        if p.default is inspect.Parameter.empty
    ]
    values = [object() for _ in names]
    k = max(len(required), 3)
    calls = [
        (tuple(values[: len(required)]), {}),
        ((), dict(zip(names, values, strict=True))),
        (tuple(values[:1]), dict(zip(names[1:k], values[1:k], strict=True))),
    ]
    for args, kwargs in calls:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        assert arguments_of(args, kwargs) == dict(bound.arguments)
    with pytest.raises(TypeError, match="multiple values"):
        arguments_of(tuple(values[:1]), {names[0]: values[0]})
    with pytest.raises(TypeError, match="unexpected keyword"):
        arguments_of(tuple(values[: len(required)]), {"no_such_argument": 1})
    if len(required) > 1:
        with pytest.raises(TypeError, match="missing"):
            arguments_of(tuple(values[:1]), {})


def test_the_vendor_path_calls_the_handle_the_chooser_loaded(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_GDN", "vendor")
    choice = gdn.choose("fused_recurrent_gated_delta_rule", CPU)
    assert choice.name == "vendor" and callable(choice.vendor)
    loads: list[str] = []
    monkeypatch.setattr(gdn, "vendor_function", lambda op: loads.append(op))
    route = gdn.dispatcher(
        "fused_recurrent_gated_delta_rule", qwen3_next.fused_recurrent_gated_delta_rule
    )
    x = _decode_inputs(seed=2)
    _recurrent(route, x, x["pool"].clone())
    assert loads == []  # the handle from the choice, not a second lookup


def test_vendor_decode_kernel_gets_the_declared_call_and_its_result_is_used(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_GDN", "vendor")
    route = gdn.dispatcher(
        "fused_recurrent_gated_delta_rule", qwen3_next.fused_recurrent_gated_delta_rule
    )
    x = _decode_inputs(seed=1)
    pool = x["pool"].clone()
    out = _recurrent(route, x, pool)
    (call,) = fake_ops.CALLS
    assert call.name == "fused_recurrent_gated_delta_rule_fwdv2"
    declared = VENDOR_CONTRACT["kunlun_ops"][call.name]
    assert set(declared) <= set(call.scalars) | set(call.tensors)
    assert call.scalars["is_h0_transposed"] is True  # vLLM's [slots, HV, K, V] pool
    assert call.scalars["inplace_final_state"] is True
    assert torch.equal(call.tensors["h0_indices"], x["slots"])
    # The fake runs transformers' recurrence: the vendor path and portable agree.
    expected, portable_pool = _portable(x)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pool, portable_pool, atol=1e-5, rtol=1e-5)


def test_a_failing_triton_kernel_falls_back_to_portable_once_with_a_warning(
    no_vendor: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    caplog.set_level(logging.WARNING, logger="vllm")
    calls = []

    def triton_kernel(A_log, a, b, dt_bias, beta=1.0, threshold=20.0):  # type: ignore[no-untyped-def]
        calls.append(1)
        raise RuntimeError("cannot compile for this device")

    monkeypatch.setattr(gdn, "triton_driver", lambda: (True, "Triton has a driver"))
    monkeypatch.setattr(gdn, "_device_of", lambda arguments: CUDA)  # a device label
    route = gdn.dispatcher("fused_gdn_gating", triton_kernel)
    args = (torch.randn(4), torch.randn(5, 4), torch.randn(5, 4), torch.randn(4))
    for _ in range(2):
        g, beta = route(*args)
        expected_g, expected_beta = gdn_portable.gdn_gating(*args)
        assert torch.equal(g, expected_g) and torch.equal(beta, expected_beta)
    assert calls == [1]  # not retried after the failure
    (warning,) = [
        r for r in caplog.records if "fused_gdn_gating failed" in r.getMessage()
    ]
    assert "cannot compile for this device" in warning.getMessage()
    assert gdn.choose("fused_gdn_gating", CUDA).name == "portable"


def test_speculative_decode_states_run_on_the_portable_kernel() -> None:
    route = gdn.dispatcher(
        "fused_recurrent_gated_delta_rule", qwen3_next.fused_recurrent_gated_delta_rule
    )
    x = _decode_inputs()
    # One sequence, three query tokens, one state slot per token, two kept last step.
    slots = torch.tensor([[5, 0, 3]], dtype=torch.int32)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    pool = x["pool"].clone()
    out, final = route(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        None,
        pool,
        True,
        cu,
        slots,
        torch.tensor([2], dtype=torch.int32),
        True,
    )
    assert final is pool
    # Token by token from slot 0 (the second slot): the one-token path's result.
    step_pool = x["pool"].clone()
    for t, slot in enumerate([0, 0, 0]):
        one = {k: x[k][:, t : t + 1] for k in ("q", "k", "v", "g", "beta")}
        o, _ = route(
            one["q"],
            one["k"],
            one["v"],
            one["g"],
            one["beta"],
            None,
            step_pool,
            True,
            torch.tensor([0, 1], dtype=torch.int32),
            torch.tensor([slot], dtype=torch.int32),
            None,
            True,
        )
        torch.testing.assert_close(out[:, t], o[:, 0])
        torch.testing.assert_close(pool[slots[0, t]], step_pool[slot])


def test_every_vendor_call_is_declared_in_the_contract() -> None:
    declared = VENDOR_CONTRACT[gdn.VENDOR_MODULE]
    for function in gdn.VENDOR_FUNCTIONS.values():
        assert function in declared
