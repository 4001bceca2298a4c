"""Engine-start guards: the doctor's checks, run while a vllm-kunlun platform starts an
engine, so that the engine refuses early with the doctor's words instead of failing an
hour later with a traceback.

- Model path (doctor check ``model_path``): a ``--model`` / ``--tokenizer`` that looks
  local but does not exist raises ``ModelPathError`` naming the nearest existing
  directories. vLLM reads the model path before any platform hook that receives it:
  ``EngineArgs.create_engine_config`` first resolves speculators
  (``maybe_override_with_speculators`` -> ``get_config_dict``, which sends a missing
  path to the Hub: HFValidationError), then builds ``ModelConfig``; with
  ``HF_HUB_OFFLINE=1`` ``EngineArgs.__post_init__`` already calls ``get_model_path``.
  ``check_and_update_config`` runs after ``ModelConfig`` (too late) and
  ``pre_register_and_update()`` gets no arguments. Mechanism: the named runtime patch
  ``engine_model_path_guard`` wraps those two readers, the module-level
  ``vllm.engine.arg_utils.maybe_override_with_speculators`` and ``.get_model_path``.
  It is installed from the platform's ``pre_register_and_update``, which vLLM calls as
  the first statement of ``create_engine_config`` and while it builds the CLI parser
  (``vllm serve``: before ``EngineArgs`` exists, so the offline path is covered too).
  ``create_engine_config`` looks the wrapped names up at call time, so the guard already
  acts in the call that installed it. The originals are kept, their upstream signatures
  are checked (the patch stays out, with a warning, when they differ) and
  ``uninstall()`` restores them.
- Stack (doctor check ``stack_versions``): a release known to break the stack (transformers
  >= 5.5: no ``Qwen2VLImageProcessor.max_pixels``) raises; other mismatches warn once.
- KV / state budget (doctor check ``kv_budget``): warns with the arithmetic and the largest
  safe ``--gpu-memory-utilization``.
The last two run from ``KunlunPlatform.check_and_update_config`` (``check_engine_config``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from vllm_kunlun.doctor.budget import (
    DEFAULT_RESERVE_GIB,
    P800_MEMORY_BYTES,
    Budget,
    ModelShape,
    estimate,
    to_finding,
    weights_bytes_per_card,
)
from vllm_kunlun.doctor.model_path import inspect_path, missing_path_message
from vllm_kunlun.doctor.stack import stack_status
from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching.attribute import (
    AttributePatch,
    PatchMismatch,
    apply_group,
    expect_params,
)
from vllm_kunlun.versions import installed_version

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

NAME = "engine_model_path_guard"
# The upstream signatures the wrappers were written for (vllm 0.15.1).
_EXPECTED = {
    "maybe_override_with_speculators": [
        "model",
        "tokenizer",
        "trust_remote_code",
        "revision",
        "vllm_speculative_config",
        "kwargs",
    ],
    "get_model_path": ["model", "revision"],
}


class ModelPathError(ValueError):
    """A local-looking model path that does not exist (instead of HFValidationError)."""


class StackError(RuntimeError):
    """An installed component release known to break the validated stack."""


def model_path_guard(model: Any, what: str = "model", cwd: str | None = None) -> None:
    """Raise ModelPathError when ``model`` looks local but does not exist."""
    if not isinstance(model, (str, os.PathLike)):
        return
    model = os.fspath(model)
    verdict = inspect_path(model, cwd or os.getcwd())
    if verdict.local and not verdict.exists:
        cause, fix = missing_path_message(model, verdict, what)
        raise ModelPathError(f"vllm-kunlun: {cause}. Fix: {fix}")


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
    ).with_mamba_cache_dtype(str(getattr(cache, "mamba_cache_dtype", "auto")))
    from vllm.platforms import current_platform

    try:
        device = int(current_platform.get_device_total_memory())
    except Exception as exc:
        logger.debug("vllm-kunlun: device memory unknown (%s); assuming a P800", exc)
        device = P800_MEMORY_BYTES
    tp = vllm_config.parallel_config.tensor_parallel_size
    path = str(model_config.model)
    return estimate(
        shape,
        device_bytes=device,
        utilization=cache.gpu_memory_utilization,
        tp=tp,
        max_num_seqs=vllm_config.scheduler_config.max_num_seqs,
        weights_bytes=weights_bytes_per_card(path, tp) if os.path.isdir(path) else None,
        reserve_gib=DEFAULT_RESERVE_GIB,
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


def check_engine_config(vllm_config: VllmConfig) -> None:
    """Called from the platform's check_and_update_config."""
    stack_guard()
    try:
        budget_guard(vllm_config)
    except Exception as exc:  # an estimate must never stop an engine
        logger.warning_once("vllm-kunlun: memory budget estimate failed: %s", exc)


# ---- the named runtime patch ------------------------------------------------------------


def _check_signature(expected: list[str]) -> Callable[[ModuleType, Any], str | None]:
    def check(module: ModuleType, original: Any) -> str | None:
        return expect_params(original, original.__name__, tuple(expected))

    return check


def _make_speculators_guard(speculators: Any) -> Any:
    spec_sig = inspect.signature(speculators)

    @functools.wraps(speculators)
    def guarded_speculators(*args: Any, **kwargs: Any) -> Any:
        bound = spec_sig.bind(*args, **kwargs)
        model, tokenizer = bound.arguments["model"], bound.arguments["tokenizer"]
        model_path_guard(model)
        if tokenizer and tokenizer != model:
            model_path_guard(tokenizer, what="tokenizer")
        return speculators(*args, **kwargs)

    return guarded_speculators


def _make_get_model_path_guard(get_model_path: Any) -> Any:
    @functools.wraps(get_model_path)
    def guarded_get_model_path(model: Any, revision: Any = None) -> Any:
        model_path_guard(model)
        return get_model_path(model, revision)

    return guarded_get_model_path


_PATCHES = tuple(
    AttributePatch(
        NAME,
        "vllm.engine.arg_utils",
        attr,
        make,
        _check_signature(_EXPECTED[attr]),
    )
    for attr, make in (
        ("maybe_override_with_speculators", _make_speculators_guard),
        ("get_model_path", _make_get_model_path_guard),
    )
)


def install() -> bool:
    """Install ``engine_model_path_guard`` (both wrappers or neither); True when this
    call installed it.

    Needs ``vllm.engine.arg_utils`` fully imported: callers are the general plugin
    (top of ``EngineArgs.__post_init__``) and the platform's ``pre_register_and_update``
    (``create_engine_config``, CLI parser), all inside arg_utils' own functions.
    """
    try:
        if not apply_group(_PATCHES):
            return False
    except PatchMismatch as exc:
        logger.warning_once(
            "vllm-kunlun: %s; a missing local model path will surface as vLLM's own "
            "error",
            str(exc),
        )
        return False
    logger.debug("vllm-kunlun: runtime patch %s installed", NAME)
    return True


def installed() -> bool:
    return all(patch.applied() for patch in _PATCHES)


def uninstall() -> None:
    """Put vLLM's original functions back."""
    for patch in reversed(_PATCHES):
        patch.revert()
