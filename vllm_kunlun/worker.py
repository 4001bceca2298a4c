"""The worker KunlunPlatform runs: vLLM's GPU worker, registering the plugin's models.

Why: vLLM resolves the model class inside the process that builds the model (the engine
core, or each worker under tensor parallelism), and a registration made elsewhere does
not reach it. The worker is constructed in exactly those processes, before the model is
loaded, and independently of ``VLLM_PLUGINS`` (see ``vllm_kunlun/models/__init__.py``).

Removal: when the plugin brings no model of its own.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.worker.gpu_worker import Worker

from vllm_kunlun.models import register_models


class KunlunWorker(Worker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        register_models()
        super().__init__(*args, **kwargs)
