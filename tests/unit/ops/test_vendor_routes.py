"""How the vendor paths are wired: declared calls only, the fakes' surface, the
out-of-tree CustomOp registration in vLLM, and which platform wants vendor kernels."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm.config import CompilationConfig

from vllm_kunlun.demo.run import choose_platform
from vllm_kunlun.doctor.vendor_contract import compare_contract
from vllm_kunlun.ops import chooser, custom_ops, routes, vendor
from vllm_kunlun.ops.contract import VENDOR_CONTRACT
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform
from vllm_kunlun.platforms.kunlun import KunlunPlatform


def test_only_declared_vendor_functions_can_be_asked_for() -> None:
    with pytest.raises(ValueError, match=r"kunlun_ops\.swiglu is not declared"):
        vendor.function("kunlun_ops", "swiglu")


def test_the_fakes_present_every_declared_call_with_its_keywords(
    fake_vendor_path: Path,
) -> None:
    """What the doctor checks on a Kunlun host, run against tests/fakes: every declared
    op exists and accepts the keywords we pass (a fake drifting from the contract
    would make the end-to-end proof meaningless)."""
    report = compare_contract(VENDOR_CONTRACT, vendor.try_load)
    assert report.missing == [] and report.mismatches == []
    assert report.checked == sum(len(calls) for calls in VENDOR_CONTRACT.values())


def test_route_status_sums_layers_calls_and_reasons(
    fake_vendor_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    routes.forget_routes()
    try:
        monkeypatch.setattr(chooser, "vendor_policy", lambda: (True, "t"))
        ready = routes.Route("silu_and_mul", ["silu_and_mul"])
        monkeypatch.setattr(chooser, "vendor_policy", lambda: (False, "off"))
        off = routes.Route("silu_and_mul", ["silu_and_mul"])
        ready.run(lambda k, x: x + 1, lambda x: x, 1)
        ready.run(lambda k, x: (_ for _ in ()).throw(routes.Refused("odd")), abs, -2)
        assert off.run(lambda k, x: 0, abs, -3) == 3
        assert routes.status() == {
            "silu_and_mul": {
                "kernels": ["kunlun_ops.silu_and_mul"],
                "modules": 2,
                "vendor_modules": 1,
                "vendor_calls": 1,
                "native_calls": 2,
                "native_reasons": ["odd", "off"],
            }
        }
    finally:
        routes.forget_routes()


# ---- out-of-tree CustomOps ------------------------------------------------------------


@pytest.fixture
def registry() -> Iterator[dict[str, Any]]:
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.platforms import current_platform

    assert current_platform is not None  # register_all waits for the platform
    custom_ops.unregister_all()
    yield op_registry_oot
    custom_ops.unregister_all()


def test_register_all_replaces_vllms_classes_under_their_op_names(
    registry: dict[str, Any],
) -> None:
    from vllm.model_executor.layers.layernorm import RMSNorm

    from vllm_kunlun.ops.custom_ops.norms import KunlunRMSNorm

    names = [r.vllm_class for r in custom_ops.REPLACEMENTS]
    assert custom_ops.register_all(policy=(True, "test")) == names
    assert custom_ops.register_all(policy=(True, "test")) == []  # idempotent
    assert registry["RMSNorm"] is KunlunRMSNorm
    # vLLM's op names stay, so custom_ops switches (+rms_norm, ...) keep meaning.
    assert [r.ours().name for r in custom_ops.REPLACEMENTS] == [
        r.upstream().name for r in custom_ops.REPLACEMENTS
    ]
    assert KunlunRMSNorm.name == RMSNorm.name == "rms_norm"
    assert set(custom_ops.OP_NAMES) == {
        r.upstream().name for r in custom_ops.REPLACEMENTS
    }
    custom_ops.unregister_all()
    assert "RMSNorm" not in registry


def test_register_all_keeps_someone_elses_replacement(registry: dict[str, Any]) -> None:
    class TheirSiluAndMul:
        pass

    registry["SiluAndMul"] = TheirSiluAndMul
    try:
        done = custom_ops.register_all(policy=(True, "test"))
        assert "SiluAndMul" not in done and registry["SiluAndMul"] is TheirSiluAndMul
    finally:
        del registry["SiluAndMul"]


def test_register_all_does_nothing_when_the_platform_wants_no_vendor_kernels(
    registry: dict[str, Any],
) -> None:
    assert custom_ops.register_all(policy=(False, "host emulation")) == []
    assert custom_ops.registered() == []


def test_enable_flags_turn_exactly_the_replaced_ops_on() -> None:
    cc = CompilationConfig(custom_ops=["none", *custom_ops.enable_flags()])
    assert all(cc.is_custom_op_enabled(n) for n in custom_ops.OP_NAMES)
    assert not cc.is_custom_op_enabled("fused_moe")


def test_log_enablement_names_the_ops_left_native(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    logged: list[str] = []

    def info_once(msg: str, *args: Any) -> None:
        hash(args)  # vLLM's *_once helpers cache on their arguments
        logged.append(msg % args)

    monkeypatch.setattr(custom_ops.logger, "info_once", info_once)
    for ops in (["all"], ["none"]):
        cfg = SimpleNamespace(compilation_config=CompilationConfig(custom_ops=ops))
        custom_ops.log_enablement(cfg)  # type: ignore[arg-type]
    (line,) = logged
    assert line.startswith("vllm-kunlun: rms_norm, gemma_rms_norm, rms_norm_gated,")
    assert "--enforce-eager" in line


# ---- which platform wants vendor kernels ------------------------------------------------


def test_kunlun_always_wants_them_emulation_only_with_the_switch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert KunlunPlatform.vendor_kernels() == (True, "KunlunPlatform")
    monkeypatch.delenv("VLLM_KUNLUN_EMULATION_VENDOR", raising=False)
    wanted, why = KunlunHostEmulationPlatform.vendor_kernels()
    assert not wanted and "VLLM_KUNLUN_EMULATION_VENDOR=1" in why
    monkeypatch.setenv("VLLM_KUNLUN_EMULATION_VENDOR", "1")
    assert KunlunHostEmulationPlatform.vendor_kernels()[0]


def test_the_switch_makes_the_demo_emulate_even_with_a_device_driver(
    monkeypatch: pytest.MonkeyPatch, fake_vendor_path: Path
) -> None:
    monkeypatch.delenv("VLLM_KUNLUN_HOST_EMULATION", raising=False)
    monkeypatch.setenv("VLLM_KUNLUN_EMULATION_VENDOR", "1")  # fake driver: 8 devices
    choice = choose_platform()
    assert choice.emulation and "VLLM_KUNLUN_EMULATION_VENDOR=1" in choice.reason
