"""Image prompts through vLLM's engine and the plugin: engine start and throughput.

Why: the composite now runs its vision tower for every image (vLLM's processor in the
front end, the tower and M-RoPE in the model); what an image costs is the time of that
path against a text prompt of the same length, in the same engine and run.

One engine (engine core in this interpreter) on a model directory (default: the tiny
Qwen3.5 composite, built locally). Per repeat, after a warm-up, ``generate`` runs N
image prompts (one synthetic image each, ``--image WxH``) and N text-only prompts with
exactly as many prompt tokens, M output tokens each, greedy. Reported (medians over
repeats): requests/s, prompt tok/s, output tok/s for both, and the ratio image / text;
the engine start (``LLM(...)``) once.

    python benchmarks/vision.py                       # tiny composite, emulation
    python benchmarks/vision.py --num-prompts 16 --image 64x64 --repeats 5 --json out.json

Host emulation numbers measure the plugin's code paths on a CPU, not a Kunlun card.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
QUESTION = "what is in this picture ?"


def parse_size(text: str) -> tuple[int, int]:
    """'64x48' -> (64, 48)."""
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"image size {text!r} is not WIDTHxHEIGHT (e.g. 64x64)"
        ) from None
    if w <= 0 or h <= 0:
        raise argparse.ArgumentTypeError(f"image size {text!r} must be positive")
    return w, h


def summarize(times: dict[str, list[float]], tokens: dict[str, dict[str, int]]) -> dict:
    """Medians over repeats: requests/s, prompt and output tok/s per kind ('image',
    'text'), and image / text ratios. ``tokens[kind]``: requests, prompt, output per
    repeat."""
    out: dict[str, Any] = {}
    for kind, series in times.items():
        t = statistics.median(series)
        n = tokens[kind]
        out[kind] = {
            "median_s": round(t, 4),
            "requests_per_s": round(n["requests"] / t, 2),
            "prompt_tok_per_s": round(n["prompt"] / t, 1),
            "output_tok_per_s": round(n["output"] / t, 1),
        }
    if "image" in out and "text" in out:
        out["ratio_image_over_text"] = {
            k: round(out["image"][k] / out["text"][k], 3)
            for k in ("requests_per_s", "output_tok_per_s")
        }
    return out


def _image(width: int, height: int, seed: int) -> Any:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def run(args: argparse.Namespace) -> dict:
    os.environ.setdefault("VLLM_KUNLUN_HOST_EMULATION", "1")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    model = args.model
    if model is None:
        from vllm_kunlun.demo.tiny_model import write_tiny_model
        from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec

        model = str(
            write_tiny_model(
                Path(tempfile.mkdtemp()) / "tiny-vl",
                TinyQwen3_5Spec(layout="composite"),
            )
        )
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(
        model=model,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=args.num_prompts,
        enable_prefix_caching=False,  # every repeat pays the full prefill
        limit_mm_per_prompt={"image": 1, "video": 0},
        seed=0,
    )
    start_s = time.perf_counter() - t0
    params = SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True)
    w, h = args.image
    text = f"you : {IMAGE} {QUESTION}\ni :"
    image_prompts = [
        {"prompt": text, "multi_modal_data": {"image": _image(w, h, i)}}
        for i in range(args.num_prompts)
    ]
    # Text prompts as long as the image prompts (placeholders expanded).
    length = len(
        llm.generate(image_prompts[:1], params, use_tqdm=False)[0].prompt_token_ids
    )
    words = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]
    text_prompts = [
        " ".join(words[(i + j) % len(words)] for j in range(length))
        for i in range(args.num_prompts)
    ]
    times: dict[str, list[float]] = {"image": [], "text": []}
    tokens: dict[str, dict[str, int]] = {}
    for _ in range(args.repeats):
        for kind, prompts in (("image", image_prompts), ("text", text_prompts)):
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            times[kind].append(time.perf_counter() - t0)
            tokens[kind] = {
                "requests": len(outs),
                "prompt": sum(len(o.prompt_token_ids or []) for o in outs),
                "output": sum(len(o.outputs[0].token_ids) for o in outs),
            }
    return {
        "model": model,
        "image_size": f"{w}x{h}",
        "num_prompts": args.num_prompts,
        "output_len": args.output_len,
        "prompt_len": length,
        "repeats": args.repeats,
        "engine_start_s": round(start_s, 2),
        **summarize(times, tokens),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="model directory (default: the tiny composite)")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--image", type=parse_size, default=(64, 64))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--json", help="also write the result here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
