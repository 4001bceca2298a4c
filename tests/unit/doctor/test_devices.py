"""Doctor check 1 (devices) on fake /dev roots, and check 0 (platform)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_kunlun.checks.finding import Context
from vllm_kunlun.doctor.devices import check_devices
from vllm_kunlun.hardware.device import DeviceProbe


def _dev(tmp_path: Path, nodes: list[int], ctrl: bool) -> Context:
    root = tmp_path / "dev"
    root.mkdir()
    for i in nodes:
        (root / f"xpu{i}").touch()
    if ctrl:
        (root / "xpuctrl").touch()
    (root / "xpu_other").touch()  # not a device node
    return Context(dev_root=str(root))


def _probe(n: int):
    return lambda: DeviceProbe(n, "fake driver" if n else "torch_xmlir not importable")


def test_full_mapping_is_ok(tmp_path: Path) -> None:
    f = check_devices(_dev(tmp_path, list(range(8)), True), _probe(8), lambda: 0)
    assert f.status == "ok"
    assert f.details["xpu_nodes"] == list(range(8))
    assert f.details["torch_xpu_device_count"] == 0
    assert "stub" in f.cause


def test_partial_mapping_names_the_missing_docker_flags(tmp_path: Path) -> None:
    f = check_devices(_dev(tmp_path, [0, 1, 2, 3], False), _probe(8), lambda: 0)
    assert f.status == "fail"
    assert "partial device mapping" in f.cause
    assert f.fix.endswith(
        "--device=/dev/xpu4 --device=/dev/xpu5 --device=/dev/xpu6 "
        "--device=/dev/xpu7 --device=/dev/xpuctrl"
    )
    assert "--device=/dev/xpu0" not in f.fix


def test_missing_ctrl_only(tmp_path: Path) -> None:
    f = check_devices(_dev(tmp_path, list(range(8)), False), _probe(8), lambda: 0)
    assert f.status == "fail"
    assert f.fix.endswith("add --device=/dev/xpuctrl")


def test_gap_in_nodes_is_named(tmp_path: Path) -> None:
    # the driver counts what it sees; a hole in the numbering is still a partial map
    f = check_devices(_dev(tmp_path, [0, 2], True), _probe(2), lambda: 0)
    assert f.status == "fail"
    assert "--device=/dev/xpu1" in f.fix and "xpuctrl" not in f.fix


def test_nodes_without_driver_fail(tmp_path: Path) -> None:
    f = check_devices(_dev(tmp_path, list(range(8)), True), _probe(0), lambda: 0)
    assert f.status == "fail"
    assert "torch_xmlir" in f.fix and "torch.xpu.device_count() = 0" in f.fix


def test_no_kunlun_host_is_a_warning(tmp_path: Path) -> None:
    f = check_devices(_dev(tmp_path, [], False), _probe(0), lambda: None)
    assert f.status == "warn"
    assert "--device=/dev/xpu7 --device=/dev/xpuctrl" in f.fix


def test_driver_count_comes_from_torch_xmlir(
    tmp_path: Path, fake_vendor_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real probe (vendor.xmlir_device_count) through the torch_xmlir fake."""
    monkeypatch.setenv("FAKE_XMLIR_DEVICES", "4")
    f = check_devices(_dev(tmp_path, [0, 1, 2, 3], True))
    assert f.status == "ok", f
    assert f.details["driver_count"] == 4
    assert f.details["driver_source"] == "torch_xmlir._XMLIRC._xpu_get_devices_number()"
