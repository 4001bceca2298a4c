"""Runtime patch ``qwen2_vl_pixel_bounds``: vLLM's Qwen2-VL / Qwen2.5-VL processing info
reads the image processor's pixel bounds where transformers 5.2.0 keeps them.

Why: vLLM 0.15.1's ``Qwen2VLProcessingInfo._get_vision_info`` (Qwen2-VL, Qwen2.5-VL and
their subclasses that do not override it) sizes every image with
``image_processor.min_pixels`` / ``max_pixels``. transformers 5.2.0's Qwen2-VL image and
video processors fold those into ``size`` (``shortest_edge`` / ``longest_edge``) when they
are built and leave the attributes ``None``, so the engine fails while it profiles the
encoder budget (``TypeError: '>' not supported between instances of 'int' and
'NoneType'`` in ``smart_resize``), for any checkpoint that accepts images.
How: the method first fills a missing ``min_pixels`` / ``max_pixels`` on the processor it
uses from that processor's ``size`` (the values transformers itself resizes by), then
runs vLLM's code. Qwen3-VL has its own method that reads ``size`` and is untouched.
Applied in every process that builds a model or processes a request
(``Phase.FRONT_END``, ``Phase.MODEL_PROCESS``). Removal: when the validated vLLM reads
``size`` for Qwen2-VL as it does for Qwen3-VL.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching.attribute import AttributePatch, expect_params

logger = init_logger(__name__)

NAME = "qwen2_vl_pixel_bounds"
MODULE = "vllm.model_executor.models.qwen2_vl"
_BOUNDS = (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge"))


def fill_pixel_bounds(processor: Any) -> bool:
    """Set ``min_pixels`` / ``max_pixels`` from ``size`` where they are None; True
    when it set one."""
    getter = getattr(getattr(processor, "size", None), "get", None)
    changed = False
    for attr, key in _BOUNDS:
        if getattr(processor, attr, None) is not None:
            continue
        value = getter(key) if callable(getter) else None
        if value is None:
            continue
        setattr(processor, attr, int(value))
        changed = True
    if changed:
        logger.info_once(
            "vllm-kunlun: %s keeps its pixel bounds in size (transformers 5); vLLM's "
            "Qwen2-VL processing reads min_pixels / max_pixels, set from it",
            type(processor).__name__,
        )
    return changed


def _check(module: ModuleType, original: Any) -> str | None:
    return expect_params(
        original,
        "Qwen2VLProcessingInfo._get_vision_info",
        (
            "self",
            "image_width",
            "image_height",
            "num_frames",
            "do_resize",
            "image_processor",
        ),
    )


def _make(original: Any) -> Any:
    @functools.wraps(original)
    def _get_vision_info(
        self: Any, *, image_processor: Any = None, **kwargs: Any
    ) -> Any:
        if image_processor is None:
            image_processor = self.get_image_processor()
        fill_pixel_bounds(image_processor)
        return original(self, image_processor=image_processor, **kwargs)

    return _get_vision_info


PATCH = AttributePatch(
    NAME, MODULE, "Qwen2VLProcessingInfo._get_vision_info", _make, _check
)


def apply() -> bool:
    """True when this call applied it; a mismatch warns (vLLM then fails on Qwen2-VL
    images as it does without the plugin)."""
    return PATCH.apply_or_warn(
        "Qwen2-VL / Qwen2.5-VL engines fail sizing images under transformers 5"
    )


# phases.apply_phase's hook (patching/phases.py)
RUNTIME_PATCHES = {NAME: lambda phase: apply()}


def revert() -> None:
    PATCH.revert()
