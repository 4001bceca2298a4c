"""Models the plugin brings to vLLM 0.15.1, registered with vLLM's ``ModelRegistry``.

Why: vLLM 0.15.1 has no Qwen3.5 implementation ("Model architectures
['Qwen3_5ForConditionalGeneration'] are not supported for now").

How: ``register_models()`` puts a lazy entry for each architecture into vLLM's
registry (the model module is imported only when that architecture is served): an
``inspection.InProcessLazyModel``, which vLLM inspects in this process instead of in a
fresh interpreter per engine start, or, when vLLM's private registry classes are not
the ones it was written for, the plain ``"module:Class"`` string (logged). It must
run in every process that resolves a model class: the process that builds the engine
config (``ModelConfig`` inspects the architecture) and every process that builds the
model (the engine core with the in-process executor, each multiprocessing or Ray worker
under tensor parallelism). The hooks, each idempotent:

- ``KunlunPlatformBase.pre_register_and_update``: vLLM calls it as the first statement
  of ``EngineArgs.create_engine_config`` (and while building the ``vllm serve`` parser),
  before ``ModelConfig`` exists;
- the worker classes the platforms select (``vllm_kunlun.platforms.worker.KunlunWorker``,
  ``emulation_worker.EmulationWorker``) register in their constructor, which vLLM runs
  in every process that then loads the model;
- the ``vllm.general_plugins`` entry point (``register_runtime_fixes``), which vLLM
  loads in every process, covers a user-chosen ``--worker-cls``.
The platform plugin is always loaded, so the first two do not depend on
``VLLM_PLUGINS`` keeping the general plugin. Not the platform constructor: vLLM builds
the platform while ``vllm.config`` is still half-imported, and the registry imports it.
``register()`` (the platform entry point) stays free of side effects.

Removal: per architecture, when the validated vLLM serves it itself.
"""

from __future__ import annotations

ARCHITECTURES = {
    "Qwen3_5ForCausalLM": "vllm_kunlun.models.qwen3_5:Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration": (
        "vllm_kunlun.models.qwen3_5_vl:Qwen3_5ForConditionalGeneration"
    ),
    "Qwen3_5MoeForCausalLM": "vllm_kunlun.models.qwen3_5_moe:Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration": (
        "vllm_kunlun.models.qwen3_5_vl:Qwen3_5MoeForConditionalGeneration"
    ),
    # The MTP draft models (speculative decoding; models/speculative_config.py maps
    # the Qwen3.5 model types to them).
    "Qwen3_5MTP": "vllm_kunlun.models.qwen3_5_mtp:Qwen3_5MTP",
    "Qwen3_5MoeMTP": "vllm_kunlun.models.qwen3_5_mtp:Qwen3_5MoeMTP",
}

# vLLM's own architectures served through a plugin subclass, which replaces vLLM's
# entry (models/qwen3_next.py: vLLM's Qwen3-Next with the GDN kernels on the seam).
WRAPPED = {
    "Qwen3NextForCausalLM": "vllm_kunlun.models.qwen3_next:Qwen3NextForCausalLM",
}


# Where torchvision is missing, the composites are served on their text path (vLLM
# 0.15.1's Qwen-VL processors import torchvision at module import).
TEXT_ONLY_COMPOSITES = {
    "Qwen3_5ForConditionalGeneration": (
        "vllm_kunlun.models.qwen3_5:Qwen3_5TextOnlyForConditionalGeneration"
    ),
    "Qwen3_5MoeForConditionalGeneration": (
        "vllm_kunlun.models.qwen3_5_moe:Qwen3_5MoeForConditionalGeneration"
    ),
}


def architectures() -> dict[str, str]:
    """``ARCHITECTURES`` for this process: the composites with their vision tower
    where torchvision can be imported, else on their text path (logged once)."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        return dict(ARCHITECTURES)
    from vllm_kunlun.logger import init_logger
    from vllm_kunlun.versions import install_hint

    init_logger(__name__).warning_once(
        "vllm-kunlun: torchvision is not installed: the Qwen3.5 composites are "
        "served on their text path (image and video requests are refused). Fix: %s",
        install_hint("torchvision"),
    )
    return {**ARCHITECTURES, **TEXT_ONLY_COMPOSITES}


def _registered_here(registry: object, arch: str, target: str) -> bool:
    entry = getattr(registry, "models", {}).get(arch)
    module, _, cls = target.partition(":")
    return (
        getattr(entry, "module_name", None) == module
        and getattr(entry, "class_name", None) == cls
    )


def register_models() -> list[str]:
    """Register the plugin's architectures not yet registered; returns those added.

    An architecture vLLM already serves under the same name is left to vLLM, except
    those in ``WRAPPED``, whose plugin subclass takes vLLM's entry.
    """
    from vllm.model_executor.models.registry import ModelRegistry

    from vllm_kunlun.models.inspection import in_process_entry

    added = []
    for arch, target in {**architectures(), **WRAPPED}.items():
        if _registered_here(ModelRegistry, arch, target):
            continue
        if arch not in WRAPPED and arch in ModelRegistry.get_supported_archs():
            continue  # vLLM's own implementation wins
        entry = in_process_entry(target)
        if entry is None:
            ModelRegistry.register_model(arch, target)
        else:
            ModelRegistry.models[arch] = entry
        added.append(arch)
    return added
