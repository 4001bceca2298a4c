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

from vllm_kunlun.platforms.runtime_fixes import prepare_model_process


class KunlunWorker(Worker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        prepare_model_process(loads_weights=True)
        super().__init__(*args, **kwargs)
