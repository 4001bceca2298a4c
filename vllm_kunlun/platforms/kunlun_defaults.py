"""The engine defaults every vllm-kunlun platform sets in ``check_and_update_config``
(``KunlunPlatformBase``; host emulation sets its own first).

Every default is logged once with its reason, so a user reading the engine log can see
what the platform changed and undo it on purpose.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from vllm_kunlun.logger import init_logger
from vllm_kunlun.ops.attention.block_sizes import DEFAULT_BLOCK_SIZE

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

WORKER_CLS = "vllm_kunlun.platforms.worker.KunlunWorker"
# Inductor fusion passes that need newer torch (pattern matcher features) or vllm._C
# fused kernels; torch 2.5.1 on Kunlun runs none of them.
DISABLED_FUSION_PASSES = (
    "fuse_norm_quant",
    "fuse_act_quant",
    "fuse_attn_quant",
    "enable_sp",
    "fuse_gemm_comms",
    "fuse_allreduce_rms",
    "enable_qk_norm_rope_fusion",
)


def _set(obj: Any, field: str, value: Any, why: str) -> None:
    old = getattr(obj, field)
    if old == value:
        return
    setattr(obj, field, value)
    logger.info(
        "vllm-kunlun default: %s.%s = %r (was %r): %s",
        type(obj).__name__,
        field,
        value,
        old,
        why,
    )


def default_worker(vllm_config: VllmConfig, worker_cls: str, why: str) -> None:
    """The platform's worker unless the user chose one (``--worker-cls``)."""
    if vllm_config.parallel_config.worker_cls == "auto":
        _set(vllm_config.parallel_config, "worker_cls", worker_cls, why)


# Ray knows no Kunlun card: the platforms ask Ray for "GPU" resources (vLLM's Ray
# executor gives a "GPU" worker num_gpus=1 and reads its ids back through Ray's own
# accelerator table, which a custom resource name is not in), so the cards reach Ray as
# GPUs: `ray start --num-gpus N` on a cluster, RAY_OVERRIDE_RESOURCES when vLLM starts
# Ray itself (what vLLM does for Intel XPUs: ray.init(num_gpus=world_size)).
# Device visibility under Ray: platforms/worker.py.
RAY_RESOURCES_ENV = "RAY_OVERRIDE_RESOURCES"


def apply_ray_defaults(vllm_config: VllmConfig, cards: int) -> None:
    """Under vLLM's Ray executor, a Ray that vLLM starts itself (no RAY_ADDRESS and no
    RAY_OVERRIDE_RESOURCES of the user's) counts ``cards`` GPUs on this host."""
    if not vllm_config.parallel_config.use_ray:
        return
    if os.environ.get("RAY_ADDRESS") or RAY_RESOURCES_ENV in os.environ:
        return
    os.environ[RAY_RESOURCES_ENV] = json.dumps({"GPU": cards})
    logger.info(
        "vllm-kunlun default: %s=%s: Ray detects no Kunlun card; a Ray that vLLM "
        "starts on this host counts its %d card(s) as GPUs (a cluster: `ray start "
        "--num-gpus N` on each host, see docs/distributed.md)",
        RAY_RESOURCES_ENV,
        os.environ[RAY_RESOURCES_ENV],
        cards,
    )


def apply_kunlun_defaults(vllm_config: VllmConfig) -> None:
    from vllm_kunlun.file_patches.engine import warn_if_not_applied
    from vllm_kunlun.platforms.runtime_fixes import warn_if_general_plugin_filtered

    warn_if_not_applied()  # once per process; names the fix `vllm-kunlun patch apply`
    warn_if_general_plugin_filtered()
    default_worker(
        vllm_config,
        WORKER_CLS,
        "vLLM's CUDA-compat GPU worker; it applies the plugin's runtime fixes and "
        "registers its models before anything is built",
    )

    cache = vllm_config.cache_config
    if cache is not None and cache.block_size is None:
        _set(cache, "block_size", DEFAULT_BLOCK_SIZE, "Triton attention default")

    pass_config = vllm_config.compilation_config.pass_config
    for name in DISABLED_FUSION_PASSES:
        if getattr(pass_config, name, False):
            _set(pass_config, name, False, "fusion pass not runnable on torch 2.5.1")

    refuse_unschedulable_prefill(vllm_config)

    from vllm_kunlun.models.gemma2_config import fill_hidden_act

    fill_hidden_act(vllm_config)  # transformers 5.2.0's Gemma 2 configs

    from vllm_kunlun.platforms.lora import refuse_unsupported_lora

    refuse_unsupported_lora(vllm_config)


def refuse_unschedulable_prefill(vllm_config: VllmConfig) -> None:
    """Refuse a hybrid with prefix caching whose step budget is below one page.

    Why: with ``mamba_cache_mode='align'`` vLLM 0.15.1's scheduler cuts every prefill
    chunk that does not reach the prompt's last whole page down to a multiple of the
    attention page (``_mamba_block_aligned_split``): with ``max_num_batched_tokens``
    below the page (400 tokens for the log's 27B at TP 8) a prompt longer than a page
    is cut to 0 tokens at every step and the engine idles forever, without an error.
    Removal: when vLLM schedules such chunks (or refuses the configuration) itself.
    """
    cache, sched = vllm_config.cache_config, vllm_config.scheduler_config
    if cache is None or sched is None or cache.mamba_cache_mode != "align":
        return
    page, budget = cache.block_size, sched.max_num_batched_tokens
    if page is None or budget is None or budget >= page:
        return
    raise ValueError(
        f"max_num_batched_tokens={budget} is smaller than this hybrid model's "
        f"attention page of {page} tokens: with prefix caching (mamba_cache_mode "
        "'align') vLLM prefills in whole pages, so a prompt longer than a page would "
        f"never be scheduled. Use --max-num-batched-tokens {page} or more, or "
        "--no-enable-prefix-caching."
    )
