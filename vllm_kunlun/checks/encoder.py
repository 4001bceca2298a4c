"""The vision encoder's memory at the configured max pixels, for the KV budget.

Why: a Qwen3.5 composite runs its vision tower on each image. vLLM's profiling run
feeds the tower a dummy image of the processor's largest size (``size.longest_edge``,
the max pixels, in ``preprocessor_config.json``) and what that peak takes comes out of
the KV cache; on the plugin's platforms the tower's attention is torch SDPA per image
(docs/models.md, "Images and video"), whose math path materializes the attention
scores: quadratic in the image's patches. A max-pixels setting made for a larger card
can leave no KV cache, or fail the engine at start.

How: the peak of one tower block on the largest image, per card (the tower's heads
and MLP width split over tensor parallel ranks as vLLM splits them): the scores and
their softmax, ``2 x heads/TP x N^2`` values, plus the block's activations
``N x (4 x hidden + 3 x hidden/TP + intermediate/TP)``, in the model dtype, N the
image's patches (max pixels / patch^2). An upper bound where the SDPA kernel is fused.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PREPROCESSOR = "preprocessor_config.json"


@dataclass(frozen=True)
class EncoderPeak:
    max_pixels: int
    patch_size: int
    heads: int
    hidden: int
    intermediate: int
    dtype_bytes: int
    tp: int

    @property
    def patches(self) -> int:
        return self.max_pixels // (self.patch_size * self.patch_size)

    def bytes_at(self, patches: int) -> int:
        heads = -(-self.heads // self.tp)
        scores = 2 * heads * patches * patches
        hidden = patches * (
            4 * self.hidden + 3 * self.hidden // self.tp + self.intermediate // self.tp
        )
        return (scores + hidden) * self.dtype_bytes

    @property
    def bytes(self) -> int:
        return self.bytes_at(self.patches)

    def max_pixels_within(self, available: float) -> int:
        """The largest max pixels (a multiple of patch^2) whose peak fits in
        ``available`` bytes; 0 when not even one patch does."""
        lo, hi = 0, self.patches
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.bytes_at(mid) <= available:
                lo = mid
            else:
                hi = mid - 1
        return lo * self.patch_size * self.patch_size


def max_pixels(preprocessor: Mapping[str, Any]) -> int | None:
    """The image processor's max pixels: ``size.longest_edge`` (transformers 5.x),
    else ``max_pixels``; None when neither is a positive integer."""
    size = preprocessor.get("size")
    value = size.get("longest_edge") if isinstance(size, Mapping) else None
    if value is None:
        value = preprocessor.get("max_pixels")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def encoder_peak(
    model_dir: str, config: Mapping[str, Any], dtype_bytes: int, tp: int
) -> EncoderPeak | None:
    """The peak of ``model_dir``'s vision tower at its max pixels, or None (no
    ``vision_config``, no readable preprocessor config, or fields missing)."""
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        return None
    try:
        with open(os.path.join(model_dir, PREPROCESSOR)) as f:
            preprocessor = json.load(f)
    except (OSError, ValueError):
        return None
    pixels = max_pixels(preprocessor) if isinstance(preprocessor, Mapping) else None
    patch, heads, hidden = (
        vision.get(k) for k in ("patch_size", "num_heads", "hidden_size")
    )
    intermediate = vision.get("intermediate_size")
    if pixels is None or not all(
        isinstance(v, int) and v > 0 for v in (patch, heads, hidden)
    ):
        return None
    assert isinstance(patch, int) and isinstance(heads, int)
    assert isinstance(hidden, int)
    return EncoderPeak(
        max_pixels=pixels,
        patch_size=patch,
        heads=heads,
        hidden=hidden,
        intermediate=intermediate if isinstance(intermediate, int) else 4 * hidden,
        dtype_bytes=dtype_bytes,
        tp=tp,
    )
