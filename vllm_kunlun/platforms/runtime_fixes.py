"""The named runtime patches applied while a vllm-kunlun platform is active, and the
schema fix, applied whenever torch < 2.6 is installed."""

from __future__ import annotations

from vllm_kunlun import envs
from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching import schema, wrap_triton
from vllm_kunlun.patching.attribute import platform_resolved
from vllm_kunlun.quantization import patches as int8_patches
from vllm_kunlun.sample import patches as sample_patches

logger = init_logger(__name__)


def apply_schema_fix() -> None:
    """``schema_pep585`` whenever torch < 2.6 is installed, whatever the platform.

    Without it ``import vllm.config`` fails on torch 2.5.1, so even client-only commands
    (``vllm bench serve --help``) die on a host without a Kunlun device. ``register()``
    calls this before it decides anything: vLLM resolves its platform (and so calls
    ``register()``) just before it registers its first custom op. Idempotent.
    """
    if envs.VLLM_KUNLUN_SCHEMA_FIX:
        if schema.apply():
            logger.info(
                "vllm-kunlun: runtime patch %s applied (torch %s infers custom-op "
                "schemas from list[int] / X | None)",
                schema.NAME,
                __import__("torch").__version__,
            )
    elif schema.needed():
        logger.warning_once(
            "vllm-kunlun: VLLM_KUNLUN_SCHEMA_FIX=0 on torch < 2.6: importing vllm.config "
            "will fail in vllm/distributed/parallel_state.py unless the patch set is "
            "applied (vllm-kunlun patch apply)"
        )


def apply_runtime_fixes() -> None:
    """Idempotent: safe in every process and on every call."""
    apply_schema_fix()
    if wrap_triton.apply():
        logger.info(
            "vllm-kunlun: runtime patch %s applied (torch %s lacks %s, which every "
            "quantized checkpoint imports)",
            wrap_triton.NAME,
            __import__("torch").__version__,
            wrap_triton.TARGET,
        )
    # Device-side sampling; deferred while vLLM is still resolving current_platform.
    sample_patches.apply_all()
    if platform_resolved():
        int8_patches.apply_if_loaded()
    # vLLM's CustomOps on the vendor kernels (when the platform wants them); deferred
    # the same way.
    from vllm_kunlun.ops import custom_ops

    custom_ops.register_all()


def prepare_model_process(loads_weights: bool = False) -> None:
    """Runtime fixes and model registrations, in a process about to build a model.

    Idempotent. Both of the plugin's workers call it first thing (independently of
    ``VLLM_PLUGINS``) with ``loads_weights``, and the general plugin calls it in the
    front-end processes. ``loads_weights``: this process loads the checkpoint, so the
    checkpoint guard goes in (it imports vLLM's model loader, seconds that a front end
    which never loads weights should not pay).
    """
    from vllm_kunlun.models import register_models

    apply_runtime_fixes()
    register_models()
    if loads_weights:
        from vllm_kunlun.guards import checkpoint

        checkpoint.apply()


GENERAL_PLUGIN = "kunlun_runtime_fixes"


def warn_if_general_plugin_filtered() -> bool:
    """Warn (once) when VLLM_PLUGINS keeps our general plugin out; True if it does.

    The workers apply the sampling patches themselves (``prepare_model_process``), but
    the front end then runs without the engine-start guards (model path, token ids).
    """
    import vllm.envs

    allowed = vllm.envs.VLLM_PLUGINS
    if allowed is None or GENERAL_PLUGIN in allowed:
        return False
    logger.warning_once(
        "vllm-kunlun: VLLM_PLUGINS=%s does not include %s: this process runs without "
        "the engine-start guards (a missing model path, out-of-range token ids). The "
        "workers still sample on the device. Fix: add %s to VLLM_PLUGINS (e.g. "
        "VLLM_PLUGINS=kunlun,%s).",
        ",".join(allowed),
        GENERAL_PLUGIN,
        GENERAL_PLUGIN,
        GENERAL_PLUGIN,
    )
    return True
