"""Engine settings host emulation needs, each one a measured fact about vLLM 0.15.1.

Set by ``KunlunHostEmulationPlatform._defaults_first`` (in ``check_and_update_config``,
before the defaults every platform shares), each logged once with its reason, so that
the emulation log says exactly what differs from a default engine.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from vllm_kunlun import envs
from vllm_kunlun.logger import init_logger
from vllm_kunlun.platforms.kunlun_defaults import _set, default_worker

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

WORKER_CLS = "vllm_kunlun.platforms.emulation_worker.EmulationWorker"
BLOCK_SIZE = 16


def _set_env(name: str, value: str, why: str) -> None:
    old = os.environ.get(name)
    if old == value:
        return
    os.environ[name] = value
    logger.info("vllm-kunlun emulation: %s=%s (was %r): %s", name, value, old, why)


def apply_emulation_defaults(vllm_config: VllmConfig) -> None:
    from vllm.config import CompilationMode, CUDAGraphMode

    device = vllm_config.device_config.device_type
    if device != "cpu":
        raise ValueError(
            "Host emulation runs on the CPU, but the engine asked for device "
            f"{device!r}. Unset --device (or unset VLLM_KUNLUN_HOST_EMULATION to use "
            "a real device)."
        )

    default_worker(
        vllm_config,
        WORKER_CLS,
        "vLLM's CPU worker and model runner, adapted to run without vllm._C; it "
        "applies the plugin's runtime fixes and registers its models first",
    )

    cache = vllm_config.cache_config
    if cache.block_size is None:
        _set(cache, "block_size", BLOCK_SIZE, "portable attention backend default")
    # CPUWorker reports this as the memory available for the KV cache; vLLM's own CPU
    # default is half the host RAM.
    kv_bytes = int(envs.VLLM_KUNLUN_EMULATION_KV_CACHE_GIB * (1 << 30))
    _set(
        cache, "cpu_kvcache_space_bytes", kv_bytes, "VLLM_KUNLUN_EMULATION_KV_CACHE_GIB"
    )

    if vllm_config.model_config is not None:
        _set(
            vllm_config.model_config,
            "disable_cascade_attn",
            True,
            "the portable backend has no cascade attention",
        )

    scheduler = vllm_config.scheduler_config
    _set(
        scheduler,
        "async_scheduling",
        False,
        "vLLM's CPU model runner is not built for it (vLLM's CPU platform turns it "
        "off too)",
    )

    spec = vllm_config.speculative_config
    if spec is not None and spec.use_eagle() and not spec.disable_padded_drafter_batch:
        _set(
            spec,
            "disable_padded_drafter_batch",
            True,
            "the padded drafter batch prepares its inputs with Triton kernels "
            "(eagle_prepare_*_padded_kernel); the unpadded path is torch",
        )

    compilation = vllm_config.compilation_config
    if compilation.mode != CompilationMode.NONE:
        _set(
            compilation,
            "mode",
            CompilationMode.NONE,
            "eager model: the engine starts in seconds and needs no torch.compile "
            "support from torch 2.5.1",
        )
    _set(compilation, "cudagraph_mode", CUDAGraphMode.NONE, "no graphs on the CPU")
    _set(compilation, "cudagraph_capture_sizes", [], "no graphs on the CPU")
    logger.info(
        "vllm-kunlun emulation: eager model, no CUDA graphs: the host CPU has no "
        "graphs to capture (KunlunPlatform captures piecewise graphs around attention)"
    )
    if envs.VLLM_KUNLUN_EMULATION_VENDOR:
        from vllm_kunlun.ops.custom_ops import enable_flags

        _set(
            compilation,
            "custom_ops",
            ["none", *enable_flags()],
            "VLLM_KUNLUN_EMULATION_VENDOR=1: the CustomOps replaced for the vendor "
            "kernels run forward_oot, every other one its torch-native path",
        )
    elif compilation.custom_ops != ["none"]:
        _set(
            compilation,
            "custom_ops",
            ["none"],
            "every CustomOp takes its torch-native path (vllm._C kernels, e.g. rotary "
            "embedding, are not available)",
        )

    _set_env(
        "VLLM_CPU_OMP_THREADS_BIND",
        "nobind",
        "thread binding calls torch.ops._C_utils.init_cpu_threads_env (vllm._C)",
    )
    _set_env(
        "VLLM_WORKER_MULTIPROC_METHOD",
        "spawn",
        "workers must not fork a process that already runs torch threads",
    )
    if vllm_config.parallel_config.use_ray:
        _set_env(
            "VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE",
            "shm",
            "Ray's compiled graph passes pipeline stages' tensors through host memory "
            "(its default transport opens a CUDA device), as vLLM does for TPU / XPU",
        )
        # Ray places the first worker on the node named by vLLM's host IP: it must be
        # the address Ray's node has, not loopback (a placement group on
        # node:127.0.0.1 is never met).
        logger.info(
            "vllm-kunlun emulation: VLLM_HOST_IP left as is under Ray (the address of "
            "this host's Ray node)"
        )
    elif "VLLM_HOST_IP" not in os.environ:
        # vLLM otherwise picks this host's network address for the engine's process
        # groups; emulation is single-host, so its traffic stays on loopback.
        _set_env(
            "VLLM_HOST_IP",
            "127.0.0.1",
            "single-host emulation keeps the engine's process groups on loopback",
        )
