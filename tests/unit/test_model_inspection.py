"""The plugin's registry entries are inspected in this process, lazily, and fall back
to vLLM's string registration when vLLM's private registry classes differ."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from vllm.model_executor.models import registry as vllm_registry
from vllm.model_executor.models.registry import ModelRegistry, _ModelInfo

from tests.conftest import run_python
from vllm_kunlun import models
from vllm_kunlun.models import inspection


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    entries = {
        a: m for a, m in ModelRegistry.models.items() if a not in models.ARCHITECTURES
    }
    monkeypatch.setattr(ModelRegistry, "models", entries)
    yield entries


def test_entries_are_inspected_without_a_subprocess(
    registry: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_subprocess(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("vLLM inspected the model class in a subprocess")

    monkeypatch.setattr(vllm_registry, "_run_in_subprocess", no_subprocess)
    models.register_models()
    for arch, target in models.ARCHITECTURES.items():
        entry = ModelRegistry.models[arch]
        assert isinstance(entry, vllm_registry._LazyRegisteredModel)
        assert type(entry) is not vllm_registry._LazyRegisteredModel
        # What vLLM's subprocess would have computed, from vLLM's own function.
        cls = entry.load_model_cls()
        assert f"{cls.__module__}:{cls.__name__}" == target
        assert entry.inspect_model_cls() == _ModelInfo.from_model_cls(cls)
    # And through vLLM's own resolution path.
    info = ModelRegistry._try_inspect_model_cls("Qwen3_5ForCausalLM")
    assert info is not None and info.is_hybrid


def test_registering_imports_no_model_code() -> None:
    proc = run_python(
        """
        import sys
        from vllm_kunlun import models
        assert models.register_models() == list(models.ARCHITECTURES)
        from vllm.model_executor.models.registry import ModelRegistry
        assert "Qwen3_5ForCausalLM" in ModelRegistry.get_supported_archs()
        print("IMPORTED", "vllm_kunlun.models.qwen3_5" in sys.modules)
        """,
        fakes=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "IMPORTED False" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        (SimpleNamespace(__name__="r"), "has no class _LazyRegisteredModel"),
        (
            SimpleNamespace(__name__="r", _LazyRegisteredModel=type("L", (), {})),
            "is not a dataclass",
        ),
    ],
)
def test_a_changed_vllm_registry_falls_back_to_strings(
    registry: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    broken: Any,
    reason: str,
) -> None:
    assert inspection.unsupported_reason(broken).endswith(reason)
    assert inspection.in_process_entry("a.b:C", vllm_registry=broken) is None
    monkeypatch.setattr(
        inspection, "in_process_entry", lambda target: None, raising=True
    )
    models.register_models()
    for arch in models.ARCHITECTURES:
        assert type(ModelRegistry.models[arch]) is vllm_registry._LazyRegisteredModel


def test_the_installed_vllm_is_the_one_written_for() -> None:
    assert inspection.unsupported_reason() is None
