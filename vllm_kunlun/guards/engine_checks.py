"""Engine-start checks: the doctor's checks, run while a vllm-kunlun platform starts an
engine, so that the engine refuses early with the doctor's words instead of failing an
hour later with a traceback.

- Stack (doctor check ``stack_versions``): a release known to break the stack
  (transformers >= 5.5: no ``Qwen2VLImageProcessor.max_pixels``) raises; other
  mismatches warn once.
- KV / state budget (doctor check ``kv_budget``): warns with the arithmetic and the
  largest safe ``--gpu-memory-utilization``; speculative decoding's extra GDN state
  blocks, draft KV and sampler rows are counted (``num_speculative_tokens``).
- Model dimensions (the ``kv_budget`` range check, ``CONFIG_LIMITS``): a config with
  100000 layers, a million heads or a 2^30 vocabulary raises ``ModelDimensionError``
  naming the field, the value and the bound, before vLLM starts building layers (it
  would otherwise spend minutes and gigabytes on them).
- Pipeline partition: a ``VLLM_PP_LAYER_PARTITION`` with a stage of no (or negative)
  layers, the wrong number of stages or the wrong total raises ``PipelinePartitionError``
  naming the value and a valid one (vLLM alone fails in the loader or an assertion).
- Qwen3.5 deployments the plugin's models do not serve (``qwen3_5_deployment.py``):
  ``ValueError`` naming the cause and the fix.
These run from ``KunlunPlatform.check_and_update_config`` (``check_engine_config``);
host emulation runs the stack and model-dimension guards (``config_range_guard``).
The model path is guarded by a runtime patch (``guards/model_path.py``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from vllm_kunlun.checks.budget import to_finding
from vllm_kunlun.checks.config_file import ConfigRangeError
from vllm_kunlun.checks.lora_budget import lora_slot_bytes
from vllm_kunlun.checks.memory_budget import (
    DEFAULT_RESERVE_GIB,
    P800_MEMORY_BYTES,
    Budget,
    estimate,
)
from vllm_kunlun.checks.model_shape import (
    CONFIG_RANGE_FIX,
    ModelShape,
    check_config_ranges,
    weights_bytes_per_card,
)
from vllm_kunlun.checks.pp_partition import pp_partition_problem
from vllm_kunlun.checks.stack import stack_status
from vllm_kunlun.guards.qwen3_5_deployment import qwen3_5_deployment_guard
from vllm_kunlun.logger import init_logger
from vllm_kunlun.versions import installed_version

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)


class StackError(RuntimeError):
    """An installed component release known to break the validated stack."""


class ModelDimensionError(RuntimeError):
    """A model config dimension outside the doctor's bounds (``CONFIG_LIMITS``).

    A RuntimeError, not a ValueError: vLLM's VllmConfig is a pydantic dataclass, which
    turns a ValueError raised in ``check_and_update_config`` into a ValidationError
    that buries the message under a dump of every config argument."""


def stack_guard(installed: Callable[[str], str | None] = installed_version) -> None:
    for check in stack_status(installed):
        comp = check.component
        if check.installed and comp.is_known_broken(check.installed):
            raise StackError(
                f"vllm-kunlun: {comp.name} {check.installed} is known to break this "
                f"stack ({comp.note}). Fix: {comp.install}"
            )
        if check.status in ("mismatch", "missing"):
            logger.warning_once(
                "vllm-kunlun: %s %s is not the validated %s; if the engine misbehaves "
                "install it: %s",
                comp.name,
                check.installed or "(not installed)",
                comp.validated,
                comp.install,
            )


def config_range_guard(vllm_config: VllmConfig) -> None:
    """Refuse, with the doctor's words, a model whose config sets a dimension outside
    ``CONFIG_LIMITS`` (``ModelDimensionError``: field, value, bound and the fix)."""
    model_config = vllm_config.model_config
    if model_config is None:
        return
    try:
        check_config_ranges(model_config.hf_config.to_dict())
    except ConfigRangeError as exc:
        raise ModelDimensionError(
            f"vllm-kunlun: {exc}, in {model_config.model}: refused before vLLM builds "
            f"the model. Fix: {CONFIG_RANGE_FIX}"
        ) from None


class PipelinePartitionError(RuntimeError):
    """``VLLM_PP_LAYER_PARTITION`` that does not fit the model and the stages (a
    RuntimeError for the reason ``ModelDimensionError`` gives)."""


def pp_partition_guard(vllm_config: VllmConfig) -> None:
    pp = vllm_config.parallel_config.pipeline_parallel_size
    model_config = vllm_config.model_config
    if pp <= 1 or model_config is None:
        return
    import vllm.envs

    layers = model_config.get_total_num_hidden_layers()
    problem = pp_partition_problem(vllm.envs.VLLM_PP_LAYER_PARTITION, pp, layers)
    if problem:
        raise PipelinePartitionError(f"vllm-kunlun: {problem}")


def engine_budget(vllm_config: VllmConfig) -> Budget | None:
    """The doctor's budget estimate for the engine about to start (None: not
    applicable: no local config, or an explicit --kv-cache-memory-bytes)."""
    model_config = vllm_config.model_config
    cache = vllm_config.cache_config
    if model_config is None or getattr(cache, "kv_cache_memory_bytes", None):
        return None
    shape = ModelShape.from_config(model_config.hf_config.to_dict())
    shape = dataclasses.replace(
        shape,
        dtype=str(model_config.dtype).replace("torch.", ""),
        block_size=int(getattr(cache, "block_size", None) or 0),
    ).with_mamba_cache_dtype(
        str(getattr(cache, "mamba_cache_dtype", "auto")),
        str(getattr(cache, "mamba_ssm_cache_dtype", "auto")),
    )
    from vllm.platforms import current_platform

    try:
        device = int(current_platform.get_device_total_memory())
    except Exception as exc:
        logger.debug("vllm-kunlun: device memory unknown (%s); assuming a P800", exc)
        device = P800_MEMORY_BYTES
    tp = vllm_config.parallel_config.tensor_parallel_size
    path = str(model_config.model)
    # Speculative decoding is budgeted (extra state blocks, draft KV, sampler rows),
    # not refused.
    spec = vllm_config.speculative_config
    weights = weights_bytes_per_card(path, tp) if os.path.isdir(path) else None
    lora = vllm_config.lora_config
    if lora is not None and weights is not None:  # the LoRA slots sit beside them
        weights += lora_slot_bytes(
            model_config.hf_config.to_dict(),
            max_loras=lora.max_loras,
            max_rank=lora.max_lora_rank,
            tp=tp,
            dtype_bytes=shape.dtype_bytes,
        )
    return estimate(
        shape,
        device_bytes=device,
        utilization=cache.gpu_memory_utilization,
        tp=tp,
        max_num_seqs=vllm_config.scheduler_config.max_num_seqs,
        weights_bytes=weights,
        reserve_gib=DEFAULT_RESERVE_GIB,
        pp=vllm_config.parallel_config.pipeline_parallel_size,
        num_spec=int(spec.num_speculative_tokens or 0) if spec is not None else 0,
    )


def budget_guard(vllm_config: VllmConfig) -> None:
    budget = engine_budget(vllm_config)
    if budget is None:
        return
    finding = to_finding(budget, {})
    if finding.status == "ok":
        logger.debug("vllm-kunlun: memory budget: %s", finding.cause)
        return
    logger.warning_once(
        "vllm-kunlun: memory budget: %s. Fix: %s\n  %s",
        finding.cause,
        finding.fix,
        "\n  ".join(finding.details["arithmetic"]),
    )


def check_engine_config(vllm_config: VllmConfig, *, budget: bool = True) -> None:
    """Called from the platform's check_and_update_config; ``budget=False`` where
    there is no device memory to fill (host emulation)."""
    stack_guard()
    config_range_guard(vllm_config)
    pp_partition_guard(vllm_config)
    qwen3_5_deployment_guard(vllm_config)
    if not budget:
        return
    try:
        budget_guard(vllm_config)
    except Exception as exc:  # an estimate must never stop an engine
        logger.warning_once("vllm-kunlun: memory budget estimate failed: %s", exc)
