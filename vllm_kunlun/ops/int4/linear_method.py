"""What the AWQ and GPTQ linear-method patches share: vLLM's ``<X>LinearMethod``
replaced by a subclass that runs on the weight-only seam (``ops/int4/seam.py``).

Why: both methods keep vLLM's ``create_weights`` and differ only in how the loaded
``qweight`` / ``qzeros`` / ``scales`` become the seam's layout; the subclass, its
name (vLLM picks a layer's weight loader by the method's class name,
``WEIGHT_LOADER_V2_SUPPORTED``), the check of vLLM's class, the forward and the phases
are one piece here. How: ``LinearMethodPatch`` takes the format's ``load`` (the
tensors handed to ``seam.prepare``, with the bits and group size) and builds the
``AttributePatch`` on ``<module>.<X>LinearMethod``, which ``<X>Config.get_quant_method``
looks up at call time. Removal: with the AWQ / GPTQ patches.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from vllm_kunlun.patching.attribute import AttributePatch, expect_caller
from vllm_kunlun.patching.quantized import QuantizedModelPatch

if TYPE_CHECKING:
    from vllm_kunlun.ops.int4.seam import Prepared

QUANTIZATION = "vllm.model_executor.layers.quantization"
# (prepared layer, bits, group size) from the method and its loaded layer; the load
# deletes the loaded tensors the seam's layout replaces.
Load = Callable[[Any, torch.nn.Module], "tuple[Prepared, int, int]"]


class LinearMethodPatch:
    """The patch ``name`` of ``<QUANTIZATION>.<quant>.<QUANT>LinearMethod``; ``owner``
    is the defining module (the subclass's ``__module__``). ``hooks()`` is the owner's
    ``RUNTIME_PATCHES``."""

    def __init__(self, name: str, quant: str, load: Load, owner: str) -> None:
        self.label = label = quant.upper()
        self.module = f"{QUANTIZATION}.{quant}"
        self.attr = f"{label}LinearMethod"
        self.load = load
        self.owner = owner
        self.patch = AttributePatch(
            name, self.module, self.attr, self._make, self._check
        )
        served = f"{label} layers use the plugin's weight-only kernel"
        self.quantized = QuantizedModelPatch(self.patch, served)
        self.hooks = self.quantized.hooks

    def _make(self, original: type) -> type:
        from vllm_kunlun.ops.int4 import seam

        load = self.load

        class KunlunLinearMethod(original):  # type: ignore[valid-type, misc]
            def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
                p, self.bits, self.group = load(self, layer)
                self.gptq_layout = p.gptq_layout
                seam.attach(layer, p, "qweight", "scales")

            def apply(
                self,
                layer: torch.nn.Module,
                x: torch.Tensor,
                bias: torch.Tensor | None = None,
            ) -> torch.Tensor:
                p = seam.attached(layer, self.gptq_layout, "qweight", "scales")
                return seam.wna16_mm(x, p, bias, self.bits, self.group)

        # keep vLLM's class name; the module says whose it is
        KunlunLinearMethod.__name__ = self.attr
        KunlunLinearMethod.__qualname__ = self.attr
        KunlunLinearMethod.__module__ = self.owner
        KunlunLinearMethod.__doc__ = (
            f"vLLM's {self.label} linear method with the plugin's weight-only kernel."
        )
        return KunlunLinearMethod

    def _check(self, module: ModuleType, original: Any) -> str | None:
        if not isinstance(original, type):
            return f"{self.module}.{self.attr} is not a class"
        for name in ("create_weights", "process_weights_after_loading", "apply"):
            if not callable(getattr(original, name, None)):
                return f"{self.module}.{self.attr} has no {name}"
        caller = f"{self.label}Config.get_quant_method"
        return expect_caller(module, caller, self.attr)

    def method_class(self) -> type:
        """The plugin's linear method class over vLLM's (tests build layers with it)."""
        original = getattr(importlib.import_module(self.module), self.attr)
        if self.patch.applied():
            return original  # type: ignore[no-any-return]
        return self._make(original)
