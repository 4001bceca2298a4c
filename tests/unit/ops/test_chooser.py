"""The one chooser (vllm_kunlun/ops/chooser.py): every kernel family takes the active
platform's policy, on vLLM's real ``current_platform`` slot and the plugin's real
platform classes, with the vendor libraries faked (tests/fakes)."""

from __future__ import annotations

import ast
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm.platforms.cpu import CpuPlatform

from tests.conftest import REPO, serve_platform
from vllm_kunlun.ops import chooser, routes
from vllm_kunlun.ops.attention.paged_vendor import ATTENTION_KERNELS
from vllm_kunlun.ops.gdn import seam as gdn
from vllm_kunlun.ops.int8 import seam as int8_mm
from vllm_kunlun.ops.lora import seam as lora
from vllm_kunlun.ops.sampling import seam as sampling
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform
from vllm_kunlun.platforms.kunlun import KunlunPlatform

CPU = torch.device("cpu")
CUDA = torch.device("cuda", 0)  # a label: no tensor is put there


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("SAMPLER", "INT8_MM", "GDN", "EMULATION_VENDOR"):
        monkeypatch.delenv(f"VLLM_KUNLUN_{name}", raising=False)
    gdn.reset()
    int8_mm.reset_selection()
    lora.reset()
    routes.forget_routes()
    yield
    gdn.reset()
    int8_mm.reset_selection()
    routes.forget_routes()


@pytest.fixture
def fakes(fake_vendor_path: Path) -> None:
    import kunlun_ops
    import xspeedgate_ops

    kunlun_ops.reset()
    xspeedgate_ops.reset()


def _route() -> tuple[str, str]:
    route = routes.Route("rms_norm", ["rmsnorm", "add_rmsnorm"])
    return ("vendor" if route.ready else "portable"), route.reason


def _attention() -> tuple[str, str]:
    route = routes.Route("attention", ATTENTION_KERNELS, family=chooser.ATTENTION)
    return ("vendor" if route.ready else "portable"), route.reason


def _named(select: Callable[[torch.device], Any]) -> Callable[[torch.device], Any]:
    def run(device: torch.device) -> tuple[str, str]:
        choice = select(device)
        return choice.name, choice.reason

    return run


# Each family's entry point as its callers use it: (name, reason) for tensors on a device.
FAMILIES: dict[str, Callable[[torch.device], tuple[str, str]]] = {
    "sampling": _named(sampling.select_kernels),
    "int8": _named(int8_mm.select_kernels),
    "gdn": _named(lambda d: gdn.choose("fused_recurrent_gated_delta_rule", d)),
    "custom_ops": lambda d: _route(),
    "attention": lambda d: _attention(),
    "lora": _named(lora.select_kernels),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_host_emulation_takes_vendor_kernels_only_with_its_switch(
    family: str, fakes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve_platform(monkeypatch, KunlunHostEmulationPlatform)
    name, reason = FAMILIES[family](CPU)
    assert name != "vendor"
    assert "VLLM_KUNLUN_EMULATION_VENDOR=1 takes the vendor ones" in reason
    gdn.reset()
    int8_mm.reset_selection()
    lora.reset()
    monkeypatch.setenv("VLLM_KUNLUN_EMULATION_VENDOR", "1")
    name, reason = FAMILIES[family](CPU)
    assert name == "vendor", reason


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_another_vllm_platform_never_gets_vendor_kernels(
    family: str, fakes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve_platform(monkeypatch, CpuPlatform())
    name, reason = FAMILIES[family](CUDA)
    assert name != "vendor"
    assert "the active vLLM platform is not a vllm-kunlun platform" in reason


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_kunlun_takes_the_vendor_kernels_on_its_device(
    family: str, fakes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve_platform(monkeypatch, KunlunPlatform)
    name, reason = FAMILIES[family](CUDA)
    assert name == "vendor", reason


@pytest.mark.parametrize("family", ["sampling", "int8", "gdn"])
def test_kunlun_keeps_cpu_tensors_off_the_vendor_kernels(
    family: str, fakes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve_platform(monkeypatch, KunlunPlatform)
    name, reason = FAMILIES[family](CPU)
    assert name in ("native", "portable")
    assert reason.startswith(
        ("the tensors are on the CPU", "the logits are on the CPU")
    )


@pytest.mark.parametrize("family", ["sampling", "int8", "gdn", "attention"])
def test_a_vendor_kernel_that_does_not_load_is_warned_about_with_the_cause(
    family: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    serve_platform(monkeypatch, KunlunPlatform)
    monkeypatch.setitem(sys.modules, "kunlun_ops", None)  # the import fails
    caplog.set_level(logging.WARNING, logger="vllm")
    name, reason = FAMILIES[family](torch.device("cuda", 1))
    assert name != "vendor"
    assert "kunlun_ops is not importable" in reason
    warned = [
        r.getMessage()
        for r in caplog.records
        if "not the vendor kernels" in r.getMessage()
    ]
    assert warned and "kunlun_ops is not importable" in warned[0]


def test_a_demanded_path_is_taken_or_refused_with_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The switches override the policy either way."""
    serve_platform(monkeypatch, CpuPlatform())
    monkeypatch.setitem(sys.modules, "kunlun_ops", None)
    for variable, call in (
        ("VLLM_KUNLUN_SAMPLER", lambda: sampling.select_kernels(CUDA)),
        ("VLLM_KUNLUN_INT8_MM", lambda: int8_mm.select_kernels(CUDA)),
        (
            "VLLM_KUNLUN_GDN",
            lambda: gdn.choose("fused_recurrent_gated_delta_rule", CUDA),
        ),
    ):
        monkeypatch.setenv(variable, "vendor")
        with pytest.raises(RuntimeError, match=f"{variable}=vendor, but kunlun_ops"):
            call()
        monkeypatch.setenv(variable, "portable")
        int8_mm.reset_selection()
        gdn.reset()
        assert call().name == "portable"


def test_each_choice_is_logged_once_with_its_reason(
    fakes: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    serve_platform(monkeypatch, KunlunPlatform)
    caplog.set_level(logging.INFO, logger="vllm")
    device = torch.device("meta")  # a device no other test logs a choice for
    for _ in range(3):
        int8_mm.reset_selection()
        assert int8_mm.select_kernels(device).name == "portable"
    lines = [
        r.getMessage()
        for r in caplog.records
        if "W8A8 int8 linear kernels on meta" in r.getMessage()
    ]
    assert lines == [
        "vllm-kunlun: W8A8 int8 linear kernels on meta: portable (the tensors are on "
        "meta, the platform runs on cuda)"
    ]


SWITCHES = {"VLLM_KUNLUN_SAMPLER", "VLLM_KUNLUN_INT8_MM", "VLLM_KUNLUN_GDN"}


def test_only_the_chooser_reads_the_kernel_switches() -> None:
    """``envs.VLLM_KUNLUN_SAMPLER`` (and the other families' switches) or a getenv of
    them anywhere else would be a second chooser."""
    allowed = {"vllm_kunlun/ops/chooser.py", "vllm_kunlun/envs.py"}
    readers = []
    for path in sorted((REPO / "vllm_kunlun").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in SWITCHES:
                readers.append(f"{rel}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.Call) and any(
                isinstance(a, ast.Constant) and a.value in SWITCHES for a in node.args
            ):
                readers.append(f"{rel}:{node.lineno} {ast.unparse(node)[:60]}")
    assert readers == []


def test_every_family_switch_is_a_validated_variable() -> None:
    from vllm_kunlun import envs

    names = {f.variable for f in chooser.FAMILIES if f.variable}
    assert names == SWITCHES
    assert names <= set(envs.registry())


def test_a_customop_that_falls_back_is_warned_about_once_at_its_first_call(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The route warns when the layer first runs vLLM's own code; the chooser, which
    made the choice when the layer was built, does not warn about the same cause."""
    serve_platform(monkeypatch, KunlunPlatform)
    monkeypatch.setitem(sys.modules, "kunlun_ops", None)
    caplog.set_level(logging.WARNING, logger="vllm")
    # An op label no other test uses: the warnings are logged once per process.
    route = routes.Route("chooser_probe", ["silu_and_mul"])
    assert not route.ready and "kunlun_ops is not importable" in route.reason
    assert not [r for r in caplog.records if "not the vendor kernels" in r.getMessage()]
    assert route.run(lambda k, x: 0, abs, -3) == 3
    warned = [r.getMessage() for r in caplog.records]
    assert any("falls back to vLLM's native torch path" in m for m in warned), warned
