"""qwen2_vl_pixel_bounds: vLLM's Qwen2-VL processing info sizes images by the bounds
transformers 5.2.0's image processors keep in ``size``
(vllm_kunlun/models/qwen2_vl_pixels.py). The engine-level proof is
tests/integration/test_e2e_qwen_vl.py (a Qwen2.5-VL engine with images)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from transformers import Qwen2VLImageProcessorFast
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
from vllm.model_executor.models import qwen2_vl

from vllm_kunlun.models import qwen2_vl_pixels as Q

BOUNDS = {"min_pixels": 16 * 16, "max_pixels": 64 * 64}


@pytest.fixture
def applied() -> Iterator[None]:
    was = Q.PATCH.applied()
    Q.apply()
    yield
    if not was:
        Q.revert()


class _Info:
    """What ``_get_vision_info`` reads from its processing info: the HF config's
    vision fields and the image processor."""

    def __init__(self, processor: Any, patch: int = 4) -> None:
        vision = type("V", (), {"patch_size": patch, "spatial_merge_size": 2})
        vision.temporal_patch_size = 2  # type: ignore[attr-defined]
        self._config = type("C", (), {"vision_config": vision})
        self._processor = processor

    def get_hf_config(self) -> Any:
        return self._config

    def get_image_processor(self) -> Any:
        return self._processor


def _processor() -> Any:
    return Qwen2VLImageProcessorFast(patch_size=4, merge_size=2, **BOUNDS)


def test_transformers_5_leaves_the_attributes_vllm_reads_empty() -> None:
    # Why the patch exists: the bounds went into size.
    processor = _processor()
    assert processor.min_pixels is None and processor.max_pixels is None
    assert processor.size["longest_edge"] == BOUNDS["max_pixels"]


@pytest.mark.parametrize(("width", "height"), [(40, 56), (160, 120), (8, 8)])
def test_vision_info_uses_the_processors_bounds(
    applied: None, width: int, height: int
) -> None:
    info = _Info(_processor())
    method = qwen2_vl.Qwen2VLProcessingInfo._get_vision_info
    size, tokens = method(
        info, image_width=width, image_height=height, image_processor=None
    )
    h, w = smart_resize(height, width, factor=8, **BOUNDS)
    assert (size.height, size.width) == (h, w)
    assert tokens == (h // 8) * (w // 8)  # merged 2x2 patches of 4 pixels


def test_fill_keeps_bounds_that_are_set() -> None:
    processor = _processor()
    processor.max_pixels = 999
    assert Q.fill_pixel_bounds(processor) is True
    assert (processor.min_pixels, processor.max_pixels) == (BOUNDS["min_pixels"], 999)
    assert Q.fill_pixel_bounds(processor) is False


def test_patch_matches_the_installed_vllm() -> None:
    assert Q.PATCH.mismatch() is None
