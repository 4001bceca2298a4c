"""A lazy ``ModelRegistry`` entry that vLLM inspects in this process, not in a new one.

Why: ``ModelRegistry.register_model(arch, "module:Class")`` makes vLLM 0.15.1 build a
``_LazyRegisteredModel``, whose ``inspect_model_cls`` imports the model class in a fresh
Python interpreter (``_run_in_subprocess``) unless the module is a file inside vLLM's
own ``model_executor/models`` directory (its on-disk cache is keyed by the hash of that
file). The subprocess imports vLLM again, once per engine start, in the process that
builds the engine config: 15-45 s of every Qwen3.5 engine start on the 2-core CI host
(docs/models.md, "Engine start"), a few seconds on a serving host. vLLM does it so that
importing a model does not initialise CUDA in the front end. Importing
``vllm_kunlun.models.qwen3_5`` initialises no device (it defines classes; layers are
built in the model's constructor, in the process that loads the model), as for vLLM's
own in-process entries (``register_model(arch, cls)``).

How: ``InProcessLazyModel`` subclasses vLLM's ``_LazyRegisteredModel`` (same frozen
fields ``module_name`` / ``class_name``, same ``load_model_cls``, so it hashes for vLLM's
``lru_cache`` and ``models/__init__._registered_here`` recognises it) and overrides only
``inspect_model_cls``: it computes ``_ModelInfo.from_model_cls(self.load_model_cls())``
here, which is exactly the function vLLM's subprocess runs. It stays lazy: vLLM inspects
and loads only the architectures the served config names, so the model module is
imported only when a Qwen3.5 is served; other models (and front ends serving them)
never import it. ``register_models`` puts the entry into ``ModelRegistry.models[arch]``,
as ``register_model`` does with its own entries. This is no runtime patch: no vLLM
object is changed, vLLM's registry gets one more entry of a type of ours.

Private vLLM API it relies on, checked by ``unsupported_reason()`` each time an entry is
made: ``vllm.model_executor.models.registry._LazyRegisteredModel`` (a dataclass whose
fields are ``module_name`` and ``class_name``, with ``load_model_cls`` and
``inspect_model_cls``), ``_ModelInfo.from_model_cls`` and the dict
``ModelRegistry.models``. When one differs, ``in_process_entry`` returns None and
``register_models`` falls back to the string registration (correct, only slower), with
one log line naming what differs.

Removal: when the validated vLLM inspects out-of-tree lazy models in-process or caches
their inspection, or serves Qwen3.5 itself.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

from vllm.model_executor.models import registry as _vllm_registry

from vllm_kunlun.logger import init_logger
from vllm_kunlun.versions import WRITTEN_FOR_VLLM

logger = init_logger(__name__)

LAZY_FIELDS = ("module_name", "class_name")


def unsupported_reason(vllm_registry: ModuleType | Any = _vllm_registry) -> str | None:
    """Why ``vllm_registry`` is not the one ``InProcessLazyModel`` was written for."""
    where = getattr(vllm_registry, "__name__", "vllm.model_executor.models.registry")
    base = getattr(vllm_registry, "_LazyRegisteredModel", None)
    if not isinstance(base, type):
        return f"{where} has no class _LazyRegisteredModel"
    if not dataclasses.is_dataclass(base):
        return f"{where}._LazyRegisteredModel is not a dataclass"
    fields = tuple(f.name for f in dataclasses.fields(base))
    if fields != LAZY_FIELDS:
        return f"{where}._LazyRegisteredModel has fields {fields}, not {LAZY_FIELDS}"
    for method in ("load_model_cls", "inspect_model_cls"):
        if not callable(getattr(base, method, None)):
            return f"{where}._LazyRegisteredModel has no method {method}"
    info = getattr(vllm_registry, "_ModelInfo", None)
    if not callable(getattr(info, "from_model_cls", None)):
        return f"{where} has no _ModelInfo.from_model_cls"
    if not isinstance(
        getattr(getattr(vllm_registry, "ModelRegistry", None), "models", None), dict
    ):
        return f"{where}.ModelRegistry.models is not a dict"
    return None


_IMPORT_TIME_REASON = unsupported_reason()
ENTRY_CLASS: type | None = None

if _IMPORT_TIME_REASON is None:

    class InProcessLazyModel(_vllm_registry._LazyRegisteredModel):  # type: ignore[misc]
        """vLLM's lazy entry, inspected in this process (module docstring)."""

        def inspect_model_cls(self) -> Any:
            model_cls = self.load_model_cls()
            return _vllm_registry._ModelInfo.from_model_cls(model_cls)

    ENTRY_CLASS = InProcessLazyModel


def in_process_entry(
    target: str, *, vllm_registry: ModuleType | Any = _vllm_registry
) -> object | None:
    """The registry entry for ``"module:Class"``, or None (logged once) to fall back."""
    reason = unsupported_reason(vllm_registry) or _IMPORT_TIME_REASON
    if reason is None and ENTRY_CLASS is not None:
        module, _, cls = target.partition(":")
        return ENTRY_CLASS(module, cls)
    logger.warning_once(
        "vllm-kunlun registers its models as lazy strings: vLLM then inspects each in "
        "a fresh interpreter at every engine start (slower, still correct), because "
        "%s. %s",
        reason,
        WRITTEN_FOR_VLLM,
    )
    return None
