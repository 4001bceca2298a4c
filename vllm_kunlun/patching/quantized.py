"""The phases of a runtime patch on a vLLM module that only quantized models import.

Why: the int8 and int4 wings each replace a name in such a module (the int8 and
mixed-precision kernel tables, the AWQ and GPTQ linear methods), and all four go in
the same way: importing the module costs seconds, so ``Phase.MODEL_PROCESS`` applies
the patch only where a quantized model's config already imported it and vLLM's
platform is resolved, while ``Phase.QUANTIZED_MODEL`` (the config's verification)
imports and applies it. A target that differs from what the patch was written for is
left alone with one warning that says what differs.
How: ``QuantizedModelPatch`` wraps the module's ``AttributePatch``; the module binds
``apply``, ``apply_if_loaded``, ``revert`` and ``RUNTIME_PATCHES`` from it in one line
(``bindings()``).
Removal: with the last of those patches.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NamedTuple

from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching.attribute import (
    AttributePatch,
    PatchMismatch,
    platform_resolved,
)
from vllm_kunlun.patching.phases import Phase

logger = init_logger(__name__)


class Bindings(NamedTuple):
    """What a patch module exposes: its three actions and its phase hook."""

    apply: Callable[[], bool]
    apply_if_loaded: Callable[[], bool]
    revert: Callable[[], None]
    runtime_patches: dict[str, Callable[[Phase], bool]]


class QuantizedModelPatch:
    """``patch`` applied in the quantized-model phases; ``served`` says, in the log
    line, what now runs on the plugin's kernel."""

    def __init__(self, patch: AttributePatch, served: str) -> None:
        self.patch = patch
        self.served = served

    def apply(self) -> bool:
        """Apply now (imports the target module); True when this call applied it."""
        try:
            done = self.patch.apply()
        except PatchMismatch as exc:
            logger.warning_once("vllm-kunlun: %s", str(exc))
            return False
        if done:
            logger.info(
                "vllm-kunlun: runtime patch %s applied (%s)",
                self.patch.name,
                self.served,
            )
        return done

    def apply_if_loaded(self) -> bool:
        """Apply only if this process already imported the target module (a quantized
        model's config did) and vLLM's platform is resolved; cheap otherwise."""
        if self.patch.module not in sys.modules or not platform_resolved():
            return False
        return self.apply()

    def revert(self) -> None:
        self.patch.revert()

    def hooks(self) -> dict[str, Callable[[Phase], bool]]:
        """``phases.apply_phase``'s hook (patching/phases.py)."""

        def hook(phase: Phase) -> bool:
            if phase is Phase.QUANTIZED_MODEL:
                return self.apply()
            return self.apply_if_loaded()

        return {self.patch.name: hook}

    def bindings(self) -> Bindings:
        """``apply, apply_if_loaded, revert, RUNTIME_PATCHES = QUANTIZED.bindings()``:
        the names a patch module binds (the last is ``phases.apply_phase``'s hook)."""
        return Bindings(self.apply, self.apply_if_loaded, self.revert, self.hooks())
