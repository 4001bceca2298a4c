"""The plugin's native ops (``torch.ops.vllm_kunlun.*``, built from csrc/).

The extension is optional at run time: without it, graph capture runs eager and the
sampler on the CPU uses the portable torch kernels; the plugin says once what is missing
and how to build it.
"""

from __future__ import annotations

import functools
import importlib

from vllm_kunlun.logger import init_logger

logger = init_logger(__name__)

_FIX = (
    "rebuild the plugin with its extension: VLLM_KUNLUN_BUILD_EXT=1 scripts/setup.sh "
    "(or pip install --no-build-isolation -e . in the serving environment)"
)


@functools.cache
def load() -> bool:
    """Load the extension once; True when ``torch.ops.vllm_kunlun`` ops exist."""
    try:
        importlib.import_module("vllm_kunlun._native")
    except ImportError as exc:
        logger.warning(
            "vllm-kunlun: native extension vllm_kunlun._native is not available (%s); "
            "torch.ops.vllm_kunlun.weak_ref_tensor and sample_rows are missing. Fix: %s",
            exc,
            _FIX,
        )
        return False
    return True


def has_op(name: str) -> tuple[bool, str]:
    """(True, what) when ``torch.ops.vllm_kunlun.<name>`` exists, else (False, why and
    the fix): an extension built from an older checkout lacks newer ops."""
    import torch

    if not load():
        return False, f"vllm_kunlun._native missing; {_FIX}"
    if not hasattr(torch.ops.vllm_kunlun, name):
        return False, (
            f"vllm_kunlun._native has no {name} (built from an older checkout); {_FIX}"
        )
    return True, f"torch.ops.vllm_kunlun.{name} loaded"


def status() -> tuple[bool, str]:
    """(available, one-line explanation) for the doctor: the graph-capture op."""
    return has_op("weak_ref_tensor")
