"""The worker KunlunPlatform runs: vLLM's GPU worker, made ready by the plugin first.

Why: vLLM builds the model and its sampler inside the process that constructs the worker
(the engine core, or each worker under tensor parallelism). Registrations and runtime
patches made elsewhere do not reach it, and the ``vllm.general_plugins`` entry point,
which also applies them, is skipped when ``VLLM_PLUGINS`` leaves it out. vLLM resolves
``worker_cls`` after the plugins and constructs the worker before the model runner: a
worker that prepares its own process removes the failure mode (vLLM's CPU-only
``exponential_`` sampler silently coming back on Kunlun).

Removal: when vLLM samples on the device without patches and the plugin brings no model
of its own.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.worker.gpu_worker import Worker


def prepare_model_process() -> None:
    """Runtime fixes and model registrations, in the process about to build a model.

    Idempotent; both of the plugin's workers call it first thing.
    """
    from vllm_kunlun.models import register_models
    from vllm_kunlun.platforms.runtime_fixes import apply_runtime_fixes

    apply_runtime_fixes()
    register_models()


class KunlunWorker(Worker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        prepare_model_process()
        super().__init__(*args, **kwargs)
