"""Every entry point the installed distribution declares resolves to a real callable."""

from __future__ import annotations

import importlib.metadata

import pytest

EXPECTED = {
    ("vllm.platform_plugins", "kunlun"): "vllm_kunlun:register",
    (
        "vllm.general_plugins",
        "kunlun_runtime_fixes",
    ): "vllm_kunlun:register_runtime_fixes",
    ("console_scripts", "vllm-kunlun"): "vllm_kunlun.cli:main",
}


def _ours() -> list[importlib.metadata.EntryPoint]:
    dist = importlib.metadata.distribution("vllm-kunlun")
    return list(dist.entry_points)


def test_declared_entry_points_are_the_expected_ones() -> None:
    declared = {(ep.group, ep.name): ep.value for ep in _ours()}
    assert declared == EXPECTED


@pytest.mark.parametrize("ep", _ours(), ids=lambda ep: f"{ep.group}:{ep.name}")
def test_entry_point_loads_to_a_callable(ep: importlib.metadata.EntryPoint) -> None:
    assert callable(ep.load())


def test_vllm_sees_our_platform_plugin() -> None:
    from vllm.plugins import PLATFORM_PLUGINS_GROUP, load_plugins_by_group

    plugins = load_plugins_by_group(PLATFORM_PLUGINS_GROUP)
    import vllm_kunlun

    assert plugins["kunlun"] is vllm_kunlun.register
