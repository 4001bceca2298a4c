"""Runtime patch ``kunlun_weak_ref_tensor``: vLLM's graph wrapper uses our native op.

Why: vLLM's ``CUDAGraphWrapper`` keeps the outputs of every captured graph as weak
references (``vllm.utils.torch_utils.weak_ref_tensors``), which call
``torch.ops._C.weak_ref_tensor``. That op lives in ``vllm._C``, which cannot load on
torch 2.5.1, so the first graph capture on Kunlun would fail. The plugin's native
extension (csrc/) provides the same op as ``torch.ops.vllm_kunlun.weak_ref_tensor``.
How: replace the module-level ``vllm.utils.torch_utils.weak_ref_tensor`` with a function
of the same contract that calls our op. ``weak_ref_tensors`` (the only caller) looks the
name up at call time, so it follows. Nothing is registered into ``torch.ops._C``. The
check refuses a vLLM whose function takes other arguments, or whose
``weak_ref_tensors`` no longer calls it by name. Applied from the platform's
``import_kernels`` once the extension has loaded; ``revert()`` restores vLLM's function.
Removal: when ``vllm._C`` loads next to the torch in use (a vLLM built for it), or vLLM
looks the op up through the platform.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from vllm_kunlun.patching.attribute import AttributePatch, expect_caller, expect_params

NAME = "kunlun_weak_ref_tensor"
MODULE = "vllm.utils.torch_utils"


def weak_ref_tensor(tensor: Any) -> Any:
    """A tensor viewing ``tensor``'s memory without keeping it alive (vLLM's contract).

    Non-tensors and empty tensors (no memory to hold) are returned unchanged.
    """
    if isinstance(tensor, torch.Tensor) and tensor.numel() > 0:
        return torch.ops.vllm_kunlun.weak_ref_tensor(tensor)
    return tensor


def _check(module: ModuleType, original: Any) -> str | None:
    return expect_params(
        original, f"{MODULE}.weak_ref_tensor", ("tensor",)
    ) or expect_caller(module, "weak_ref_tensors", "weak_ref_tensor")


PATCH = AttributePatch(
    NAME, MODULE, "weak_ref_tensor", lambda original: weak_ref_tensor, _check
)


def apply() -> bool:
    """Install the patch (idempotent); True when installed by this call."""
    return PATCH.apply()


def apply_or_warn() -> bool:
    """vLLM's graph wrapper keeps captured outputs through our weak_ref_tensor op; a
    vLLM whose function differs keeps its own (which needs vllm._C), with a warning."""
    return PATCH.apply_or_warn("graph capture calls vLLM's own weak_ref_tensor")


# phases.apply_phase's hook (patching/phases.py)
RUNTIME_PATCHES = {NAME: lambda phase: apply_or_warn()}


def revert() -> None:
    PATCH.revert()


def applied() -> bool:
    return PATCH.applied()
