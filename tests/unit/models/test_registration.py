"""The plugin's models reach vLLM's ModelRegistry from every hook, lazily, vLLM inspects
them in-process (no subprocess per engine start), and the hybrid KV cache manager is
allowed on both platforms."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from vllm.model_executor.models import registry as vllm_registry
from vllm.model_executor.models.registry import ModelRegistry, _ModelInfo
from vllm.platforms.interface import Platform

import vllm_kunlun
from tests.conftest import run_python
from vllm_kunlun import models
from vllm_kunlun.hardware import EMULATION_PLATFORM
from vllm_kunlun.models import inspection
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform
from vllm_kunlun.platforms.kunlun import KunlunPlatform

# What register_models adds: the plugin's architectures, then vLLM's it wraps.
ADDED = [*models.ARCHITECTURES, *models.WRAPPED]
TARGETS = {**models.ARCHITECTURES, **models.WRAPPED}


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
    assert models.register_models() == ADDED
    for arch, target in TARGETS.items():
        entry = ModelRegistry.models[arch]
        assert type(entry) is inspection.ENTRY_CLASS
        assert isinstance(entry, vllm_registry._LazyRegisteredModel)
        assert f"{entry.module_name}:{entry.class_name}" == target  # not imported
    entries = dict(ModelRegistry.models)
    assert models.register_models() == []
    assert ModelRegistry.models == entries  # the same entries, not replaced


def _no_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's inspection subprocess (and any subprocess) fails from here on."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a subprocess was started")

    monkeypatch.setattr(vllm_registry, "_run_in_subprocess", refuse)
    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)


@pytest.mark.parametrize("arch", ADDED)
def test_vllm_inspects_the_entries_in_this_process(
    registry: dict[str, Any], monkeypatch: pytest.MonkeyPatch, arch: str
) -> None:
    import importlib

    module, _, name = TARGETS[arch].partition(":")
    cls = getattr(importlib.import_module(module), name)
    models.register_models()
    _no_subprocess(monkeypatch)
    entry = ModelRegistry.models[arch]
    plain = vllm_registry._LazyRegisteredModel(entry.module_name, entry.class_name)
    with pytest.raises(AssertionError, match="a subprocess was started"):
        plain.inspect_model_cls()  # what a string registration does
    # vLLM's own function on the class is the reference.
    expected = _ModelInfo.from_model_cls(cls)
    assert entry.inspect_model_cls() == expected
    # And through vLLM's registry, as ModelConfig asks it (its cache emptied first).
    vllm_registry._try_inspect_model_cls.cache_clear()
    config = SimpleNamespace(
        model_impl="auto", convert_type="none", runner_type="generate"
    )
    assert ModelRegistry.inspect_model_cls([arch], config) == (expected, arch)
    assert ModelRegistry.resolve_model_cls([arch], config) == (cls, arch)


def test_register_models_falls_back_to_strings_naming_why(
    registry: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from vllm.logger import _print_warning_once

    _print_warning_once.cache_clear()  # warning_once: a line this process logged before
    caplog.set_level(logging.WARNING, logger="vllm")  # its handler on "vllm" itself
    monkeypatch.delattr(vllm_registry, "_ModelInfo")  # a vLLM that renamed it
    assert models.register_models() == ADDED
    for arch, target in TARGETS.items():
        entry = ModelRegistry.models[arch]
        assert type(entry) is vllm_registry._LazyRegisteredModel  # vLLM's own
        assert f"{entry.module_name}:{entry.class_name}" == target
    [line] = [
        r.getMessage() for r in caplog.records if "lazy strings" in r.getMessage()
    ]
    assert "has no _ModelInfo.from_model_cls" in line
    assert "written for vLLM 0.15.1" in line


@dataclass(frozen=True)
class _OtherLazy:
    module_name: str
    class_name: str
    module_hash: str = ""

    def load_model_cls(self) -> None: ...

    def inspect_model_cls(self) -> None: ...


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"_LazyRegisteredModel": None}, "has no class _LazyRegisteredModel"),
        ({"_LazyRegisteredModel": object}, "_LazyRegisteredModel is not a dataclass"),
        (
            {"_LazyRegisteredModel": _OtherLazy},
            "has fields ('module_name', 'class_name', ",
        ),
        (
            {"ModelRegistry": SimpleNamespace(models=[])},
            "ModelRegistry.models is not a dict",
        ),
    ],
)
def test_a_changed_vllm_registry_is_named(change: dict[str, Any], reason: str) -> None:
    fake = SimpleNamespace(
        __name__="vllm.model_executor.models.registry",
        **{
            name: getattr(vllm_registry, name)
            for name in ("_LazyRegisteredModel", "_ModelInfo", "ModelRegistry")
        },
    )
    assert inspection.unsupported_reason(fake) is None
    for name, value in change.items():
        setattr(fake, name, value)
    assert reason in (inspection.unsupported_reason(fake) or "")
    assert inspection.in_process_entry("m:C", vllm_registry=fake) is None


def test_register_models_imports_no_model_code() -> None:
    """A front end that serves another model never imports the plugin's models."""
    proc = run_python(
        """
        import sys
        from vllm_kunlun.models import register_models
        from vllm.model_executor.models.registry import ModelRegistry

        added = register_models()
        entry = ModelRegistry.models["Qwen3_5ForCausalLM"]
        print(added, type(entry).__name__, "vllm_kunlun.models.qwen3_5" in sys.modules)
        """,
        env={"VLLM_KUNLUN_HOST_EMULATION": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == (f"{ADDED} InProcessLazyModel False")


def test_an_architecture_vllm_serves_is_left_to_vllm(
    registry: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    vllms_own = ModelRegistry.models["Qwen3ForCausalLM"]
    monkeypatch.setitem(
        models.ARCHITECTURES, "Qwen3ForCausalLM", "vllm_kunlun.models.qwen3_5:X"
    )
    assert "Qwen3ForCausalLM" not in models.register_models()
    assert ModelRegistry.models["Qwen3ForCausalLM"] is vllms_own


def test_vllms_qwen3_next_is_served_through_the_plugins_subclass(
    registry: dict[str, Any],
) -> None:
    """vLLM's own entry is replaced (its GDN layers need the plugin's kernels), by a
    subclass: vLLM's model, weight loading and state shapes stay vLLM's."""
    from vllm.model_executor.models import qwen3_next as upstream

    from vllm_kunlun.models import qwen3_next

    vllms_own = ModelRegistry.models["Qwen3NextForCausalLM"]
    assert vllms_own.module_name == upstream.__name__
    assert "Qwen3NextForCausalLM" in models.register_models()
    entry = ModelRegistry.models["Qwen3NextForCausalLM"]
    assert entry.module_name == qwen3_next.__name__
    assert issubclass(qwen3_next.Qwen3NextForCausalLM, upstream.Qwen3NextForCausalLM)
    # vLLM's MTP draft for it stays vLLM's.
    assert ModelRegistry.models["Qwen3NextMTP"].module_name.startswith("vllm.")


def test_what_vllm_learns_when_it_inspects_the_classes() -> None:
    """What vLLM's registry computes from the classes (``InProcessLazyModel``)."""
    from vllm_kunlun.models import qwen3_5, qwen3_5_vl

    for cls in (
        qwen3_5.Qwen3_5ForCausalLM,
        qwen3_5.Qwen3_5TextOnlyForConditionalGeneration,
        qwen3_5_vl.Qwen3_5ForConditionalGeneration,
        qwen3_5_vl.Qwen3_5MoeForConditionalGeneration,
    ):
        info = _ModelInfo.from_model_cls(cls)
        assert info.is_hybrid and info.has_inner_state and info.is_text_generation_model
        # Images reach only the composite with its tower; the others' are refused by
        # vLLM's front end.
        vl = cls.__module__ == qwen3_5_vl.__name__
        assert info.supports_multimodal == vl
        assert info.supports_multimodal_encoder_tp_data == vl
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


@pytest.mark.parametrize(
    "arch", ["Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"]
)
def test_the_composites_are_multimodal_with_torchvision_and_text_only_without(
    arch: str,
    registry: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """vLLM 0.15.1's Qwen-VL processors import torchvision: without it the composites
    are registered on their text path, and the log names the install command."""
    import importlib.util

    from vllm.logger import _print_warning_once

    _print_warning_once.cache_clear()  # warning_once: a line this process logged before
    seen = vllm_registry._ModelInfo.from_model_cls
    with_tv = models.architectures()[arch]
    assert with_tv == f"vllm_kunlun.models.qwen3_5_vl:{arch}"
    module, _, name = with_tv.partition(":")
    assert seen(getattr(importlib.import_module(module), name)).supports_multimodal

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda n, *a: None if n == "torchvision" else real(n, *a),
    )
    caplog.set_level(logging.WARNING, logger="vllm")  # its handler on "vllm" itself
    without = models.architectures()
    models.register_models()
    text_only = models.TEXT_ONLY_COMPOSITES[arch]
    assert without[arch] == text_only
    entry = ModelRegistry.models[arch]
    assert f"{entry.module_name}:{entry.class_name}" == text_only
    module, _, name = text_only.partition(":")
    assert not seen(getattr(importlib.import_module(module), name)).supports_multimodal
    assert "pip install --no-deps torchvision==0.20.1" in caplog.text
    # The text models do not depend on it.
    assert {a: t for a, t in without.items() if "Conditional" not in a} == {
        a: t for a, t in models.ARCHITECTURES.items() if "Conditional" not in a
    }
