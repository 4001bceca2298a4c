"""vLLM platform plugin for Kunlun P800 XPUs.

Only entry-point functions live here. vLLM calls them in every process (API server,
engine core, each worker), more than once, and swallows their exceptions: they are
cheap, re-entrant, and log the reason before anything escapes.
"""

from __future__ import annotations

from vllm_kunlun.versions import __version__ as __version__
from vllm_kunlun.versions import validated_version

# The validated vLLM on the validated torch logs these in every process; each is
# expected and harmless here (README.md, "Messages you can ignore", says why). Said once
# per process, before they appear, so that nobody debugs them.
KNOWN_MESSAGES_LINE = (
    f"vllm-kunlun: expected on vLLM {validated_version('vllm')} + torch "
    f'{validated_version("torch")}, harmless: WARNING "Failed to '
    "import from vllm._C\" (vLLM's CUDA kernels; the plugin uses none of them), ERROR "
    '"Failed to import Triton kernels ... triton.language.target_info" (gpt-oss MoE '
    'kernels that need triton >= 3.4), "Triton is installed but 0 active driver(s)" '
    'and "No CUDA runtime is found" (a host without a GPU); see README.md, "Messages '
    'you can ignore"'
)


def register() -> str | None:
    """``vllm.platform_plugins`` entry point: the platform class path, or None.

    None when no Kunlun device is present, so that installing the plugin into a CUDA
    or CPU image never takes vLLM's own platform away.
    """
    from vllm_kunlun.logger import init_logger

    logger = init_logger(__name__)
    try:
        from vllm_kunlun.hardware import select_platform
        from vllm_kunlun.patching.phases import Phase, apply_phase
        from vllm_kunlun.patching.schema import needed as schema_fix_needed

        # Device or not: on torch < 2.6 no vLLM command imports vllm.config without
        # the schema fix, this phase's patch.
        apply_phase(Phase.PROCESS_START)
        if schema_fix_needed():  # the stack whose vLLM logs the known messages
            logger.info_once(KNOWN_MESSAGES_LINE)
        selection = select_platform()
        logger.debug("vllm-kunlun: %s", selection.reason)
        return selection.platform
    except Exception:
        # vLLM swallows this exception and silently falls back to another platform.
        logger.exception("vllm-kunlun: register() failed; the Kunlun platform is off")
        raise


def register_runtime_fixes() -> None:
    """``vllm.general_plugins`` entry point: runtime fixes for the active platform.

    Does nothing unless the current platform is one of ours, or none is: vLLM loads
    general plugins just before its engine arguments infer the device, so this is where
    a command that cannot work without a device says why (vLLM would say "Failed to
    infer device type").
    """
    from vllm.platforms import current_platform

    if current_platform.is_unspecified():
        from vllm_kunlun import envs
        from vllm_kunlun.hardware.device import (
            NoDeviceError,
            no_device_message,
            probe_devices,
        )

        envs.validate_all()  # a malformed VLLM_KUNLUN_* may be why register() failed
        raise NoDeviceError(no_device_message(probe_devices()))

    from vllm_kunlun.logger import init_logger

    logger = init_logger(__name__)
    try:
        from vllm_kunlun.hardware import active_plugin_platform

        if active_plugin_platform() is None:
            return
        from vllm_kunlun.platforms.runtime_fixes import (
            prepare_front_end,
            prepare_model_process,
        )

        prepare_model_process()
        # vLLM loads general plugins at the top of EngineArgs.__post_init__, before it
        # resolves the model path, and only from inside functions: arg_utils is fully
        # imported here (and the API server, under vllm serve), which the platform's
        # __init__ cannot rely on.
        prepare_front_end()
    except Exception:
        logger.exception("vllm-kunlun: applying runtime fixes failed")
        raise
