"""Runtime patch ``torch_wrap_triton``: ``torch.library.wrap_triton`` on torch 2.5.1.

Why: vLLM 0.15.1's ``get_quantization_config`` imports every quantization method, and
one of them (``quantization/qutlass_utils.py``, via FP-Quant) does ``from torch.library
import wrap_triton`` at module level. torch 2.5.1 has that function only under its
earlier private name ``torch._library.triton.capture_triton`` (2.6 made it public as
``wrap_triton``), so loading ANY quantized checkpoint fails with ImportError.
How: add ``torch.library.wrap_triton`` as that same function. Nothing existing
changes; the name is only called on FP-Quant's CUDA path.
Why a runtime patch, not a file of the patch set: a file patch would need the manual
``vllm-kunlun patch apply`` step, while this fix must hold in every fresh install with
no step (quantized checkpoints are the log's deployment), it is a torch-version gap
like ``schema_pep585`` (which is fixed the same way), and it reaches every vLLM module
that imports the name, not one file. Applied in every process of a vllm-kunlun
platform; ``vllm-kunlun patch status`` and the doctor's ``patchset`` check show it.
Unnecessary from: torch 2.6, which has ``torch.library.wrap_triton`` (the patch then
reports "not needed" and is never applied).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from vllm_kunlun.patching.attribute import AttributePatch, expect_params

NAME = "torch_wrap_triton"
TARGET = "torch.library.wrap_triton"
SOURCE = "torch._library.triton.capture_triton"


def _capture_triton() -> Any:
    from torch._library import triton

    return getattr(triton, "capture_triton", None)


def _check(module: ModuleType, original: Any) -> str | None:
    if original is not None:
        return f"{TARGET} exists already (torch {torch.__version__}): nothing to add"
    return expect_params(_capture_triton(), SOURCE, ("triton_kernel",))


def _make(original: Any) -> Any:
    return _capture_triton()


PATCH = AttributePatch(
    NAME, "torch.library", "wrap_triton", _make, _check, may_be_absent=True
)


def needed() -> bool:
    """True while torch lacks ``torch.library.wrap_triton`` of its own."""
    return PATCH.applied() or not hasattr(torch.library, "wrap_triton")


def apply() -> bool:
    """Add the name when torch lacks it; True when this call added it."""
    if not needed() or PATCH.applied():
        return False
    return PATCH.apply()


def apply_and_log() -> bool:
    """``apply``, logged once when it added the name."""
    if not apply():
        return False
    from vllm_kunlun.logger import init_logger  # vLLM's logger: not for the CLI

    init_logger(__name__).info(
        "vllm-kunlun: runtime patch %s applied (torch %s lacks %s, which every "
        "quantized checkpoint imports)",
        NAME,
        torch.__version__,
        TARGET,
    )
    return True


# phases.apply_phase's hook (patching/phases.py)
RUNTIME_PATCHES = {NAME: lambda phase: apply_and_log()}


def revert() -> None:
    PATCH.revert()


def state() -> str:
    """One line for ``patch status`` and the doctor."""
    if not needed():
        return f"not needed: torch {torch.__version__} has {TARGET}"
    if PATCH.applied():
        return f"applied: {TARGET} = {SOURCE}"
    problem = PATCH.mismatch()
    if problem:
        return f"CANNOT APPLY: {problem}"
    return (
        f"needed on torch {torch.__version__} (quantized checkpoints import "
        f"{TARGET}); applied by the platform in every vLLM process"
    )
