"""End to end in host emulation: the tiny Qwen3.5 composite sees. Images and a video
through vLLM 0.15.1's engine and the plugin (vLLM's Qwen3-VL processor, the plugin's
``Qwen3_5ForConditionalGeneration``: vision tower, M-RoPE, hybrid text model), greedy,
token for token equal to transformers 5.2.0's ``Qwen3_5ForConditionalGeneration`` with
its own ``Qwen3VLProcessor`` on the same prompts and pixels.

Two engines (module-scoped, engine core in the runner's interpreter), each followed by
transformers' reference in the same interpreter:
- ``run``: the dense composite with a 32-token budget, so that the larger images'
  placeholder tokens are prefilled over several chunks, prefix caching (vLLM's
  ``align`` mode for the hybrid) and up to three images and one video per prompt;
- ``moe_run``: the MoE composite (the same tower before the sparse text model) on
  images, a text-only prompt in the same batch and a video.
And ``vllm-kunlun demo --model <the dense composite> --in-process``, which answers its
text prompts and one image prompt (an engine in its own interpreter).
Images are synthetic (``e2e_runner.synthetic_image``: seeded gradients with noise).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, child_env
from tests.integration.e2e_runner import greedy_vl
from tests.integration.engine_specs import (
    BLOCK_SIZE,
    LLM_ARGS,
    TOKEN_BUDGET,
    req,
    run_spec,
)
from vllm_kunlun.demo.tiny_model import write_tiny_model
from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec
from vllm_kunlun.demo.tiny_qwen3_5_moe import TinyQwen3_5MoeSpec

pytestmark = pytest.mark.slow

VISION_ARGS = {**LLM_ARGS, "limit_mm_per_prompt": {"image": 3, "video": 1}}
TOKENS = 8
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"


def vreq(prompt: str, images: list[list[int]] | None = None, **extra: Any) -> dict:
    """A greedy request with synthetic images ``[width, height, seed]``."""
    return {**req(prompt, TOKENS), "images": images or [], **extra}


LONG_TEXT = (
    "the quick brown fox jumps over the lazy dog and the small red river runs "
    "through the old city at night while the engine reads a long story"
)
PREFIXED = f"you : {LONG_TEXT} {IMAGE} what is in this picture ?\ni :"

JOBS = [
    {
        "name": "one_image",
        "requests": [vreq(f"you : {IMAGE} what is this ?\ni :", [[40, 56, 1]])],
    },
    {
        "name": "two_images",
        "requests": [
            vreq(
                f"you : {IMAGE} and {IMAGE} which one is red ?\ni :",
                [[32, 32, 2], [56, 24, 3]],
            )
        ],
    },
    {
        # Sizes and aspect ratios: the smallest, wide, tall, and one beyond
        # max_pixels (resized down as transformers' processor does).
        "name": "sizes",
        "requests": [
            vreq(f"you : {IMAGE} tell me\ni :", [size])
            for size in ([16, 16, 4], [96, 24, 5], [24, 80, 6], [160, 120, 7])
        ],
    },
    {
        "name": "mixed",
        "requests": [
            vreq(f"you : {IMAGE} what colour ?\ni :", [[48, 48, 8]]),
            vreq("the quick brown fox jumps over the lazy dog"),
            vreq(f"you : one two {IMAGE} three\ni :", [[24, 40, 9]]),
            vreq("red green blue"),
        ],
    },
    {
        # 64 image tokens after 30 text tokens, under a 32-token budget: the image's
        # placeholders are prefilled over three steps.
        "name": "chunked",
        "requests": [vreq(PREFIXED, [[64, 64, 10]])],
    },
    # The same prompt and image again: its blocks (and the GDN state at them) come
    # from the prefix cache; the same text with another image must not reuse the
    # blocks past the image.
    {"name": "prefix_hit", "requests": [vreq(PREFIXED, [[64, 64, 10]])]},
    {"name": "prefix_other_image", "requests": [vreq(PREFIXED, [[64, 64, 11]])]},
    {
        "name": "video",
        "requests": [vreq(f"you : {VIDEO} what happens ?\ni :", video=[4, 48, 32, 12])],
    },
]


MOE_JOBS = [
    {
        "name": "moe_batch",
        "requests": [
            vreq(f"you : {IMAGE} what is this ?\ni :", [[40, 56, 1]]),
            vreq("the quick brown fox jumps over the lazy dog"),
            vreq(f"you : {IMAGE} or {IMAGE} ?\ni :", [[64, 48, 2], [16, 32, 3]]),
        ],
    },
    {
        "name": "moe_video",
        "requests": [vreq(f"you : {VIDEO} what happens ?\ni :", video=[4, 48, 32, 12])],
    },
]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e_vision")


@pytest.fixture(scope="module")
def checkpoint(work: Path) -> str:
    return str(
        write_tiny_model(work / "composite", TinyQwen3_5Spec(layout="composite"))
    )


@pytest.fixture(scope="module")
def run(checkpoint: str, work: Path) -> dict:
    spec = {
        "backend": "vllm",
        "model": checkpoint,
        "llm": VISION_ARGS,
        "engine_in_process": True,
        "jobs": JOBS,
        "hf_vl_jobs": JOBS,
    }
    return run_spec(spec, work, "vision", timeout=600)


@pytest.fixture(scope="module")
def moe_run(work: Path) -> dict:
    spec = TinyQwen3_5MoeSpec(layout="composite")
    model = str(write_tiny_model(work / "moe", spec))
    llm = {**VISION_ARGS, "enable_prefix_caching": False, "max_num_batched_tokens": 256}
    return run_spec(
        {
            "backend": "vllm",
            "model": model,
            "llm": llm,
            "engine_in_process": True,
            "jobs": MOE_JOBS,
            "hf_vl_jobs": MOE_JOBS,
        },
        work,
        "vision_moe",
        timeout=600,
    )


@pytest.mark.parametrize("job", [j["name"] for j in MOE_JOBS])
def test_moe_composite_greedy_matches_transformers(moe_run: dict, job: str) -> None:
    for got, want in zip(_rows(moe_run, job), moe_run["hf_vl"][job], strict=True):
        assert got["prompt_token_ids"] == want["prompt_token_ids"], job
        assert got["token_ids"] == want["token_ids"], (job, got["text"])
    assert len({tuple(r["token_ids"]) for r in moe_run["hf_vl"]["moe_batch"]}) == 3


def _rows(run: dict, job: str) -> list[dict[str, Any]]:
    return run["jobs"][job]


@pytest.mark.parametrize("job", [j["name"] for j in JOBS])
def test_greedy_matches_transformers_token_for_token(run: dict, job: str) -> None:
    for got, want in zip(_rows(run, job), run["hf_vl"][job], strict=True):
        # The same placeholder expansion (image size after resizing, video frames
        # and timestamps) and the same generated tokens.
        assert got["prompt_token_ids"] == want["prompt_token_ids"], job
        assert got["token_ids"] == want["token_ids"], (job, got["text"])


def _image_tokens(checkpoint: str, row: dict) -> list[int]:
    """Positions of the image placeholder tokens in the row's prompt."""
    import json

    config = json.loads((Path(checkpoint) / "config.json").read_text())
    image = config["image_token_id"]
    return [i for i, t in enumerate(row["prompt_token_ids"]) if t == image]


def test_the_images_change_the_answer(run: dict) -> None:
    """Distinct images give distinct answers to the same text (the tower is not
    ignored), and the reference is not degenerate."""
    sizes = [r["token_ids"] for r in run["hf_vl"]["sizes"]]
    assert len({tuple(t) for t in sizes}) == len(sizes)
    hit, other = run["hf_vl"]["prefix_hit"][0], run["hf_vl"]["prefix_other_image"][0]
    assert hit["prompt_token_ids"] == other["prompt_token_ids"]
    assert hit["token_ids"] != other["token_ids"]
    for row in run["hf_vl"]["sizes"]:
        assert len(set(row["token_ids"])) >= TOKENS // 2, row


def test_image_sizes_follow_the_processors_pixel_bounds(
    run: dict, checkpoint: str
) -> None:
    """Merged tokens per image: (h/8)*(w/8) after the processor's resize; the image
    beyond max_pixels (160x120) is resized to at most max_pixels."""
    spec = TinyQwen3_5Spec(layout="composite")
    counts = [len(_image_tokens(checkpoint, r)) for r in _rows(run, "sizes")]
    factor = (spec.vision_patch_size * 2) ** 2  # pixels per merged token
    assert counts[0] == spec.min_pixels // factor  # 16x16: the minimum, 4 tokens
    assert counts[1] != counts[2]  # wide and tall keep their shapes
    assert counts[3] <= spec.max_pixels // factor < 160 * 120 // factor
    two = _rows(run, "two_images")[0]
    assert len(_image_tokens(checkpoint, two)) == 4 * 4 + 7 * 3  # 32x32, 56x24


def test_chunked_prefill_split_the_image_and_the_prefix_cache_was_hit(
    run: dict, checkpoint: str
) -> None:
    (chunked,) = _rows(run, "chunked")
    image = _image_tokens(checkpoint, chunked)
    assert len(image) == 64
    # The image's placeholders span at least two token-budget boundaries.
    boundaries = {p // TOKEN_BUDGET for p in image}
    assert len(boundaries) >= 3, (image[0], image[-1])
    (hit,) = _rows(run, "prefix_hit")
    (other,) = _rows(run, "prefix_other_image")
    assert hit["token_ids"] == chunked["token_ids"]
    # Whole blocks past the image were reused for the same image ...
    assert hit["num_cached_tokens"] > image[-1] // BLOCK_SIZE * BLOCK_SIZE, hit
    # ... and at most the text before the image for another one.
    assert other["num_cached_tokens"] <= image[0], other
    assert other["token_ids"] != hit["token_ids"]


DEMO_TOKENS = 8


@pytest.fixture(scope="module")
def demo(checkpoint: str, work: Path) -> tuple[dict, str]:
    out = work / "demo.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_kunlun.cli",
            "demo",
            "--model",
            checkpoint,
            "--max-tokens",
            str(DEMO_TOKENS),
            "--in-process",
            "--json-out",
            str(out),
            "-v",
        ],
        env=child_env({"VLLM_PLUGINS": "kunlun"}, fakes=False),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_the_demo_answers_an_image_prompt_as_transformers_does(
    demo: tuple[dict, str], checkpoint: str
) -> None:
    """``vllm-kunlun demo --model DIR`` on a vision-language checkpoint: one image
    prompt through the chat template, greedy == transformers on the same picture."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from vllm_kunlun.demo.run import IMAGE_QUESTION, demo_image

    report, stdout = demo
    seen = report["image_generation"]
    assert seen is not None and len(seen["token_ids"]) == DEMO_TOKENS
    processor = AutoProcessor.from_pretrained(checkpoint)
    content = [{"type": "image"}, {"type": "text", "text": IMAGE_QUESTION}]
    prompt = processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": content}],
        tokenize=False,
        add_generation_prompt=True,
    )
    inputs = processor(text=[prompt], images=[demo_image()], return_tensors="pt")
    model = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32)
    assert seen["prompt_token_ids"] == inputs["input_ids"][0].tolist()
    assert seen["token_ids"] == greedy_vl(model.eval(), inputs, DEMO_TOKENS)
    assert f"image> {seen['prompt']}\n  {seen['text'].strip()}" in stdout
    assert len(report["generations"]) == 4  # the text prompts as before
