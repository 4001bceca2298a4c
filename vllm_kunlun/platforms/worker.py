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

import os
from collections.abc import MutableMapping
from typing import Any

from vllm.v1.worker.gpu_worker import Worker

from vllm_kunlun.logger import init_logger
from vllm_kunlun.platforms.kunlun import KunlunPlatform
from vllm_kunlun.platforms.runtime_fixes import prepare_model_process

logger = init_logger(__name__)

DEVICE_ENV = KunlunPlatform.device_control_env_var
CUDA_ENV = "CUDA_VISIBLE_DEVICES"


def align_ray_visible_devices(
    use_ray: bool, environ: MutableMapping[str, str] = os.environ
) -> bool:
    """Under vLLM's Ray executor, CUDA_VISIBLE_DEVICES lists the host's cards, as
    XPU_VISIBLE_DEVICES does.

    Why: Ray sets CUDA_VISIBLE_DEVICES to the worker's one card; vLLM then sets the
    platform's XPU_VISIBLE_DEVICES to every card of the host and opens
    ``cuda:<local rank>``. Kunlun's CUDA-compatible runtime counts the one-card list:
    every rank but the first fails with "invalid device ordinal". Ray must not be told
    to leave CUDA_VISIBLE_DEVICES unset (RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES):
    Ray's compiled graph, which vLLM's Ray executor runs, looks each worker's card up
    in that list. Returns whether it changed the variable.
    """
    if not use_ray:
        return False
    cards = environ.get(DEVICE_ENV)
    if not cards or environ.get(CUDA_ENV) == cards:
        return False
    logger.info(
        "vllm-kunlun: %s=%s (was %r) under Ray: the host's cards, as %s, so that "
        "cuda:<local rank> is this worker's card",
        CUDA_ENV,
        cards,
        environ.get(CUDA_ENV),
        DEVICE_ENV,
    )
    environ[CUDA_ENV] = cards
    return True


class KunlunWorker(Worker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        prepare_model_process(loads_weights=True)
        config = kwargs.get("vllm_config")
        if config is not None:
            align_ray_visible_devices(config.parallel_config.use_ray)
        super().__init__(*args, **kwargs)
