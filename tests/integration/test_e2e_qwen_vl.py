"""End to end in host emulation: vLLM 0.15.1's own Qwen2.5-VL and Qwen3-VL models on
checkpoints as transformers 5.2.0 writes them (tests/integration/qwen_vl_checkpoint.py),
greedy, token for token equal to transformers' ``...ForConditionalGeneration`` with its
own processor on the same prompts and pixels: with images, a video, and text only.

Without the plugin's ``transformers5_config_fields`` fix both fail at model init
(``AttributeError: '...TextConfig' object has no attribute 'tie_word_embeddings'``,
issue 42). Two engines (module-scoped, engine core in the runner's interpreter), each
followed by transformers' reference in the same interpreter:
- ``qwen2_5_vl``: the portable kernels, tied embeddings (the top-level flag only, as the
  released 3B sets it), windowed + full vision blocks;
- ``qwen3_vl``: the vendor path (``VLLM_KUNLUN_EMULATION_VENDOR=1`` with the fakes of
  tests/fakes), untied embeddings, DeepStack.
Qwen2.5-VL also needs ``qwen2_vl_pixel_bounds`` (vLLM reads pixel bounds transformers 5
keeps elsewhere: a TypeError while the engine profiles).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.engine_specs import EMULATION, LLM_ARGS, req, run_spec
from tests.integration.qwen_vl_checkpoint import write_qwen_vl

pytestmark = pytest.mark.slow

TOKENS = 8
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
VISION_ARGS = {
    **LLM_ARGS,
    "enable_prefix_caching": False,
    "max_num_batched_tokens": 256,
    "limit_mm_per_prompt": {"image": 2, "video": 1},
}


def vreq(prompt: str, images: list[list[int]] | None = None) -> dict[str, Any]:
    """A greedy request with synthetic images ``[width, height, seed]``."""
    return {**req(prompt, TOKENS), "images": images or []}


JOBS = [
    {
        "name": "image",
        "requests": [
            vreq(f"you : {IMAGE} what is this ?\ni :", [[40, 56, 1]]),
            vreq(f"you : {IMAGE} what is this ?\ni :", [[96, 24, 5]]),
        ],
    },
    {
        "name": "two_images",
        "requests": [
            vreq(
                f"you : {IMAGE} and {IMAGE} which one is red ?\ni :",
                [[32, 32, 2], [64, 48, 3]],
            )
        ],
    },
    {
        # four frames of 32x32 (two temporal patches), frame timing from the metadata
        "name": "video",
        "requests": [
            {**vreq(f"you : {VIDEO} what happens ?\ni :"), "video": [4, 32, 32, 3]}
        ],
    },
    {
        "name": "text_only",
        "requests": [
            vreq("the quick brown fox jumps over the lazy dog"),
            vreq("one two three"),
        ],
    },
]
RUNS = {
    "qwen2_5_vl": (True, EMULATION),
    "qwen3_vl": (False, {**EMULATION, "VLLM_KUNLUN_EMULATION_VENDOR": "1"}),
}


@pytest.fixture(scope="module", params=sorted(RUNS))
def run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict:
    family = request.param
    tied, env = RUNS[family]
    work = tmp_path_factory.mktemp(family)
    model = str(write_qwen_vl(work / "ckpt", family, tied=tied))
    spec = {
        "backend": "vllm",
        "model": model,
        "llm": VISION_ARGS,
        "engine_in_process": True,
        "jobs": JOBS,
        "hf_vl_jobs": JOBS,
    }
    result = run_spec(spec, work, family, env=env, timeout=600)
    result["family"] = family
    return result


@pytest.mark.parametrize("job", [j["name"] for j in JOBS])
def test_greedy_matches_transformers_token_for_token(
    run: dict, job: str, request: pytest.FixtureRequest
) -> None:
    if (run["family"], job) == ("qwen2_5_vl", "video"):
        # Same prompt tokens, same first three tokens, then vLLM's Qwen2.5-VL departs
        # from transformers (a 0.23 logit margin at the fourth: not rounding); images
        # and Qwen3-VL's video agree. Not found yet (docs/models.md).
        request.applymarker(
            pytest.mark.xfail(strict=True, reason="Qwen2.5-VL video: docs/models.md")
        )
    ours, ref = run["jobs"][job], run["hf_vl"][job]
    assert [r["prompt_token_ids"] for r in ours] == [
        r["prompt_token_ids"] for r in ref
    ], f"{run['family']}: the processors expanded the prompt differently"
    assert [r["token_ids"] for r in ours] == [r["token_ids"] for r in ref], run[
        "family"
    ]


def test_the_image_changes_the_answer(run: dict) -> None:
    # The same prompt text with two images: the vision tower's output reaches the text.
    a, b = run["jobs"]["image"]
    assert a["prompt_token_ids"] != b["prompt_token_ids"]  # other sizes, other counts
    assert a["token_ids"] != b["token_ids"]


def test_the_served_path_is_the_one_asked_for(run: dict) -> None:
    serving = run["serving"][0]
    backends = " ".join(serving["attention_backends"])
    expected = "Kunlun" if run["family"] == "qwen3_vl" else "Portable"
    assert expected in backends, serving
