"""The named runtime patches applied while a vllm-kunlun platform is active."""

from __future__ import annotations

from vllm_kunlun import envs
from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching import schema
from vllm_kunlun.sample import patches as sample_patches

logger = init_logger(__name__)


def apply_runtime_fixes() -> None:
    """Idempotent: safe in every process and on every call."""
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
    # Device-side sampling; deferred while vLLM is still resolving current_platform.
    sample_patches.apply_all()
