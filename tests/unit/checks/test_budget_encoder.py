"""The KV budget with a vision tower: its peak at the processor's max pixels comes out
of the KV cache, and where it leaves none the fix names a max pixels that fits."""

from __future__ import annotations

import json
import re
from pathlib import Path

from vllm_kunlun.checks.budget import check_kv_budget
from vllm_kunlun.checks.finding import Context
from vllm_kunlun.checks.model_shape import GIB
from vllm_kunlun.checks.weights import QWEN3_5_27B

P800 = 96 * GIB
# Qwen3.5's vision tower as transformers 5.2.0's Qwen3_5VisionConfig defaults it.
VISION = {
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_heads": 16,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 5120,
}
MAX_PIXELS = 16_777_216  # 4096 x 4096: 65,536 patches of 16 x 16


def _model(tmp_path: Path, max_pixels: int | None, name: str = "m") -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**QWEN3_5_27B, "vision_config": VISION}))
    with open(d / "model.safetensors", "wb") as f:
        f.truncate(28_000_000_000)  # sparse
    if max_pixels is not None:
        size = {"shortest_edge": 65_536, "longest_edge": max_pixels}
        (d / "preprocessor_config.json").write_text(json.dumps({"size": size}))
    return str(d)


def _check(model: str, tp: int):  # type: ignore[no-untyped-def]
    ctx = Context(
        model=model,
        device_memory_bytes=P800,
        tensor_parallel_size=tp,
        max_num_seqs=64,
        gpu_memory_utilization=0.75,
    )
    return check_kv_budget(ctx)


def _expected(patches: int, tp: int) -> int:
    """Scores and softmax of 16/TP heads over all patch pairs, plus one block's
    activations, in bfloat16 (2 bytes)."""
    heads = 16 // tp
    scores = 2 * heads * patches * patches
    activations = patches * (4 * 1152 + 3 * 1152 // tp + 4304 // tp)
    return (scores + activations) * 2


def test_the_encoder_at_max_pixels_comes_out_of_the_kv_cache(tmp_path: Path) -> None:
    with_tower = _check(_model(tmp_path, MAX_PIXELS, "vl"), tp=8)
    text_only = _check(_model(tmp_path, None, "text"), tp=8)
    encoder = _expected(65_536, tp=8)  # 2 heads per card: 32.68 GiB
    assert with_tower.details["encoder_bytes"] == encoder
    assert text_only.details["encoder_bytes"] == 0
    assert text_only.details["kv_bytes"] - with_tower.details["kv_bytes"] == encoder
    assert with_tower.status == text_only.status == "ok", with_tower
    arithmetic = "\n".join(with_tower.details["arithmetic"])
    assert (
        "vision encoder at max pixels 16777216 (65536 patches, one image) = 32.68 GiB"
        in arithmetic
    )
    assert "KV cache <= budget - weights - vision encoder = " in arithmetic
    assert "vision encoder" not in "\n".join(text_only.details["arithmetic"])


def test_an_encoder_that_leaves_no_kv_cache_fails_with_a_max_pixels_that_fits(
    tmp_path: Path,
) -> None:
    """One card: all 16 heads' scores over 65,536 patches are 256 GiB."""
    f = _check(_model(tmp_path, MAX_PIXELS, "big"), tp=1)
    assert f.status == "fail", f
    assert "the vision encoder at the processor's max pixels (16777216" in f.cause
    assert "no room for a KV cache" in f.cause
    match = re.search(r"\"max_pixels\": (\d+)", f.fix)
    assert match and "--mm-processor-kwargs" in f.fix, f.fix
    assert "--limit-mm-per-prompt" in f.fix
    pixels = int(match.group(1))
    assert 0 < pixels < MAX_PIXELS and pixels % (16 * 16) == 0
    # The suggested max pixels leaves a KV cache.
    again = _check(_model(tmp_path, pixels, "fixed"), tp=1)
    assert again.details["kv_bytes"] > 0 and again.status != "fail", again
    assert again.details["encoder_bytes"] == _expected(pixels // 256, tp=1)
    assert again.details["encoder_bytes"] <= again.details["kv_bytes"] + 1
