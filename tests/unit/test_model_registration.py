"""The plugin's models reach vLLM's ModelRegistry from every hook, lazily, and the
hybrid KV cache manager is allowed on both platforms."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from vllm.model_executor.models.registry import ModelRegistry, _ModelInfo
from vllm.platforms.interface import Platform

import vllm_kunlun
from vllm_kunlun import models
from vllm_kunlun.platforms import EMULATION_PLATFORM
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform
from vllm_kunlun.platforms.kunlun import KunlunPlatform


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """vLLM's registry with none of the plugin's architectures; restored after."""
    entries = {
        a: m for a, m in ModelRegistry.models.items() if a not in models.ARCHITECTURES
    }
    monkeypatch.setattr(ModelRegistry, "models", entries)
    yield entries


def test_vllm_0_15_1_has_no_qwen3_5(registry: dict[str, Any]) -> None:
    assert not set(models.ARCHITECTURES) & set(ModelRegistry.get_supported_archs())


def test_register_models_adds_lazy_entries_once(registry: dict[str, Any]) -> None:
    assert models.register_models() == list(models.ARCHITECTURES)
    for arch, target in models.ARCHITECTURES.items():
        entry = ModelRegistry.models[arch]
        assert f"{entry.module_name}:{entry.class_name}" == target  # not imported
    assert models.register_models() == []


def test_an_architecture_vllm_serves_is_left_to_vllm(
    registry: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    vllms_own = ModelRegistry.models["Qwen3ForCausalLM"]
    monkeypatch.setitem(
        models.ARCHITECTURES, "Qwen3ForCausalLM", "vllm_kunlun.models.qwen3_5:X"
    )
    assert "Qwen3ForCausalLM" not in models.register_models()
    assert ModelRegistry.models["Qwen3ForCausalLM"] is vllms_own


def test_what_vllm_learns_when_it_inspects_the_classes() -> None:
    """What vLLM's registry computes from the classes (in its inspection subprocess)."""
    from vllm_kunlun.models import qwen3_5

    for cls in (qwen3_5.Qwen3_5ForCausalLM, qwen3_5.Qwen3_5ForConditionalGeneration):
        info = _ModelInfo.from_model_cls(cls)
        assert info.is_hybrid and info.has_inner_state and info.is_text_generation_model
        assert not info.supports_multimodal  # images are refused by vLLM's front end
        assert not info.supports_mamba_prefix_caching  # prefix caching in 'align' mode
        assert cls.supports_mrope


def test_the_config_building_process_registers_before_modelconfig(
    registry: dict[str, Any],
) -> None:
    KunlunPlatform.pre_register_and_update()
    assert set(models.ARCHITECTURES) <= set(ModelRegistry.models)


@pytest.mark.parametrize(
    ("module", "cls_name", "parent"),
    [
        (
            "vllm_kunlun.platforms.worker",
            "KunlunWorker",
            "vllm.v1.worker.gpu_worker.Worker",
        ),
        (
            "vllm_kunlun.platforms.emulation_worker",
            "EmulationWorker",
            "vllm.v1.worker.cpu_worker.CPUWorker",
        ),
    ],
)
def test_workers_register_before_they_build_anything(
    registry: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    module: str,
    cls_name: str,
    parent: str,
) -> None:
    import importlib

    worker_cls = getattr(importlib.import_module(module), cls_name)
    parent_module, _, parent_name = parent.rpartition(".")
    parent_cls = getattr(importlib.import_module(parent_module), parent_name)
    seen: list[bool] = []

    def parent_init(self: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(set(models.ARCHITECTURES) <= set(ModelRegistry.models))

    monkeypatch.setattr(parent_cls, "__init__", parent_init)
    worker_cls(vllm_config=None, local_rank=0, rank=0, distributed_init_method="x")
    assert seen == [True]


def test_the_platform_selects_the_registering_worker() -> None:
    from vllm_kunlun.platforms import emulation_defaults, kunlun_defaults

    assert kunlun_defaults.WORKER_CLS == "vllm_kunlun.platforms.worker.KunlunWorker"
    assert (
        emulation_defaults.WORKER_CLS
        == "vllm_kunlun.platforms.emulation_worker.EmulationWorker"
    )


def test_the_platform_entry_point_registers_nothing(
    registry: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_HOST_EMULATION", "1")
    assert vllm_kunlun.register() == EMULATION_PLATFORM
    assert not set(models.ARCHITECTURES) & set(ModelRegistry.models)


def test_both_platforms_support_the_hybrid_kv_cache() -> None:
    assert Platform.support_hybrid_kv_cache() is False  # vLLM's default
    assert KunlunPlatform.support_hybrid_kv_cache() is True
    assert KunlunHostEmulationPlatform.support_hybrid_kv_cache() is True
