"""What a process runs before vLLM builds its engine or model, in one place: in a
process about to build a model, the model-process phase of the runtime patches
(``patching/phases.py``), the model registrations, and the checkpoint guard where the
process loads weights; in a front end, the front-end phase and the registrations."""

from __future__ import annotations

from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching.phases import Phase, apply_phase

logger = init_logger(__name__)


def prepare_model_process(loads_weights: bool = False) -> None:
    """Runtime fixes and model registrations, in a process about to build a model.

    Idempotent. Both of the plugin's workers call it first thing (independently of
    ``VLLM_PLUGINS``) with ``loads_weights``, and the general plugin calls it in the
    front-end processes. ``loads_weights``: this process loads the checkpoint, so the
    checkpoint guard goes in (it imports vLLM's model loader, seconds that a front end
    which never loads weights should not pay).
    """
    from vllm_kunlun.models import register_models

    apply_phase(Phase.MODEL_PROCESS)
    register_models()
    if loads_weights:
        apply_phase(Phase.WEIGHT_LOAD)


def prepare_front_end() -> None:
    """The front-end phase (engine-start guards: model path, token ids, ...) and the
    model registrations, before vLLM reads ``--model`` and resolves the architecture.

    Idempotent. Called by the platform's ``pre_register_and_update`` (the CLI parser,
    the top of ``create_engine_config``) and by the general plugin (which vLLM loads
    in ``EngineArgs.__post_init__``), whichever comes first in a process.
    """
    from vllm_kunlun.models import register_models

    apply_phase(Phase.FRONT_END)
    register_models()


GENERAL_PLUGIN = "kunlun_runtime_fixes"


def warn_if_general_plugin_filtered() -> bool:
    """Warn (once) when VLLM_PLUGINS keeps our general plugin out; True if it does.

    The workers apply the sampling patches themselves (``prepare_model_process``), but
    the front end then runs without the engine-start guards (model path, token ids),
    and an engine core without a model in its process misses the scheduler-side fix
    ``kunlun_mamba_cache_written`` (models/hybrid_layer_patches.py).
    """
    import vllm.envs

    allowed = vllm.envs.VLLM_PLUGINS
    if allowed is None or GENERAL_PLUGIN in allowed:
        return False
    logger.warning_once(
        "vllm-kunlun: VLLM_PLUGINS=%s does not include %s: this process runs without "
        "the engine-start guards (a missing model path, out-of-range token ids), and "
        "an engine core that builds no model (tensor parallel > 1) without the hybrid "
        "prefix-cache fix kunlun_mamba_cache_written (wrong tokens for requests that "
        "share a prefix in one batch). The workers still sample on the device. Fix: "
        "add %s to VLLM_PLUGINS (e.g. VLLM_PLUGINS=kunlun,%s).",
        ",".join(allowed),
        GENERAL_PLUGIN,
        GENERAL_PLUGIN,
        GENERAL_PLUGIN,
    )
    return True
