"""The Qwen3.5 composite's pieces that need no engine: M-RoPE positions against
transformers 5.2.0's own ``get_rope_index``, the vision config vLLM's tower gets, and
the vision-encoder attention choice on both platforms."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Model
from vllm.v1.attention.backends.registry import AttentionBackendEnum

from vllm_kunlun.models.qwen3_5_vl import (
    mrope_positions,
    vision_config_without_deepstack,
)
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform
from vllm_kunlun.platforms.kunlun import KunlunPlatform

VS, VE, IMG, VID = 10, 11, 12, 13
CONFIG = Qwen3_5Config(
    vision_start_token_id=VS,
    vision_end_token_id=VE,
    image_token_id=IMG,
    video_token_id=VID,
    vision_config={"spatial_merge_size": 2},
)


def _feature(modality: str, offset: int, grid: list[int]) -> Any:
    key = f"{modality}_grid_thw"
    return SimpleNamespace(
        modality=modality,
        mm_position=SimpleNamespace(offset=offset),
        data={key: SimpleNamespace(data=torch.tensor(grid))},
    )


def _prompt(
    *parts: Any,
) -> tuple[list[int], list[Any], list[list[int]], list[list[int]]]:
    """Tokens and features from text runs (int: that many text tokens) and
    ("image" | "video", [t, h, w]) items; videos as Qwen3.5 lays them out: per frame
    two timestamp tokens, then start, the frame's placeholders, end."""
    tokens: list[int] = []
    features, images, videos = [], [], []
    for part in parts:
        if isinstance(part, int):
            tokens += [1 + (i % 7) for i in range(part)]
            continue
        modality, (t, h, w) = part
        per_frame = (h // 2) * (w // 2)
        if modality == "image":
            tokens.append(VS)
            features.append(_feature("image", len(tokens), [t, h, w]))
            tokens += [IMG] * per_frame + [VE]
            images.append([t, h, w])
        else:
            features.append(_feature("video", len(tokens), [t, h, w]))
            for _ in range(t):
                tokens += [3, 4, VS] + [VID] * per_frame + [VE]
            videos.append([t, h, w])
    return tokens, features, images, videos


@pytest.mark.parametrize(
    "parts",
    [
        (5,),
        (3, ("image", [1, 4, 6]), 4),
        (("image", [1, 8, 4]), 2, ("image", [1, 2, 10]), 3),
        (2, ("video", [3, 4, 4]), 5),
        (1, ("image", [1, 6, 6]), 2, ("video", [2, 2, 8]), ("image", [1, 4, 2])),
    ],
    ids=["text", "one_image", "two_images", "video", "images_and_video"],
)
def test_mrope_positions_equal_transformers_get_rope_index(parts: tuple) -> None:
    tokens, features, images, videos = _prompt(*parts)
    got, delta = mrope_positions(CONFIG, tokens, features)
    reference = Qwen3_5Model.get_rope_index
    holder = SimpleNamespace(config=CONFIG)
    want, want_delta = reference(
        holder,  # type: ignore[arg-type]
        torch.tensor([tokens]),
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor(videos) if videos else None,
    )
    assert got.shape == (3, len(tokens))
    assert torch.equal(got, want[:, 0, :]), (got, want[:, 0, :])
    assert delta == int(want_delta.view(-1)[0])


def test_the_tower_gets_no_deepstack_as_transformers_uses_none() -> None:
    vision = vision_config_without_deepstack(CONFIG)
    assert vision.deepstack_visual_indexes == []
    assert not hasattr(CONFIG.vision_config, "deepstack_visual_indexes")  # a copy
    CONFIG.vision_config.deepstack_visual_indexes = [1, 2]
    try:
        assert vision_config_without_deepstack(CONFIG).deepstack_visual_indexes == []
    finally:
        del CONFIG.vision_config.deepstack_visual_indexes


@pytest.mark.parametrize("platform", [KunlunPlatform, KunlunHostEmulationPlatform])
def test_vision_attention_is_portable_sdpa_and_others_are_refused(
    platform: Any,
) -> None:
    sdpa = AttentionBackendEnum.TORCH_SDPA
    assert platform.get_supported_vit_attn_backends() == [sdpa]
    assert platform.get_vit_attn_backend(64, torch.float32) == sdpa
    assert platform.get_vit_attn_backend(64, torch.bfloat16, sdpa) == sdpa
    with pytest.raises(ValueError) as refused:
        platform.get_vit_attn_backend(
            64, torch.bfloat16, AttentionBackendEnum.FLASH_ATTN
        )
    message = str(refused.value)
    assert "FLASH_ATTN cannot run" in message and platform._attn_where in message
    assert "FlashAttention" in message and "Use TORCH_SDPA" in message
