"""The demo job: vLLM's engine generating through the plugin, on whatever this host has.

Why: one command has to prove the whole path on a fresh machine (engine start, worker,
model runner, attention, the plugin's sampler in the decode loop) and say what served
it. On a Kunlun host that is KunlunPlatform; elsewhere the demo switches this process
(and the engine processes it starts) to host emulation and says so. The default model
is the deployment log's model in miniature (a Qwen3.5 vision-language composite, hybrid,
W8A8-INT8 text linears), the model the plugin exists for; ``qwen3`` is a dense tiny
model vLLM could serve without the plugin. Both are built locally: nothing is
downloaded.

The engine is started inside ``run_demo`` (an importable function), never at import
time: vLLM's engine processes are spawned and re-import the caller's main module.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vllm_kunlun.hardware import EMULATION_ENV

# Every word is in the tiny model's vocabulary (a test checks it).
DEFAULT_PROMPTS = (
    "the quick brown fox jumps over the lazy dog",
    "the kunlun engine can decode one token at a time",
    "each layer has its own key value cache",
    "one two three four five",
)


# The image prompt of a vision-language model: a deterministic picture and a question.
IMAGE_QUESTION = "what is in this picture ?"
IMAGE_SIZE = (64, 48)


def demo_image() -> Any:
    """The demo's picture: a colour gradient with a dark square (deterministic)."""
    import numpy as np
    from PIL import Image

    w, h = IMAGE_SIZE
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (w + h)], axis=-1)
    img[h // 4 : h // 2, w // 4 : w // 2] = 20
    return Image.fromarray(img.astype(np.uint8))


def image_messages() -> list[dict[str, Any]]:
    """One user turn: the demo image (a PNG data URL) and the question."""
    import base64
    import io

    buf = io.BytesIO()
    demo_image().save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": IMAGE_QUESTION},
            ],
        }
    ]


def sees_images(model_dir: str) -> bool:
    """Whether ``model_dir`` is a vision-language checkpoint with its image processor
    (config.json with a ``vision_config``, and ``preprocessor_config.json``)."""
    import json

    path = Path(model_dir)
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return "vision_config" in config and (path / "preprocessor_config.json").is_file()


# The tiny models ``--model`` names (anything else is a model directory).
TINY_MODELS = {
    "qwen3_5": "the deployment log's model in miniature: tiny Qwen3.5 composite "
    "(Qwen3_5ForConditionalGeneration), hybrid (Gated DeltaNet + gated attention), "
    "W8A8-INT8 text linears, vision tower, MTP head and lm_head float",
    "qwen3": "tiny Qwen3 (dense, float32)",
}
DEFAULT_MODEL = "qwen3_5"


def tiny_model_dir(name: str) -> Path:
    """The named tiny model in the cache directory, built there first if missing."""
    from vllm_kunlun.demo.tiny_model import default_cache_dir, ensure_tiny_model

    if name == "qwen3":
        return ensure_tiny_model(default_cache_dir())
    if name == "qwen3_5":
        from vllm_kunlun.demo.tiny_quant import ensure_tiny_w8a8, w8a8_cache_dir
        from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec

        spec = TinyQwen3_5Spec(layout="composite")
        return ensure_tiny_w8a8(w8a8_cache_dir(spec), spec)
    raise ValueError(f"no tiny model {name!r}; known: {', '.join(TINY_MODELS)}")


@dataclass(frozen=True)
class PlatformChoice:
    emulation: bool
    reason: str


@dataclass
class Generation:
    prompt: str
    text: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    num_cached_tokens: int


@dataclass
class DemoReport:
    platform_choice: str
    emulation: bool
    model: str
    model_kind: str
    engine_mode: str
    import_s: float
    engine_start_s: float
    generate_s: float
    prompt_tokens: int
    output_tokens: int
    output_tokens_per_s: float
    generations: list[Generation] = field(default_factory=list)
    # A vision-language model also answers one image prompt (IMAGE_QUESTION about
    # demo_image(), through the chat template); None for a text model.
    image_generation: Generation | None = None
    serving: list[dict[str, Any]] = field(default_factory=list)
    demo_pid: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_platform() -> PlatformChoice:
    """Kunlun when a device is present (or the platform is forced), else emulation."""
    from vllm_kunlun.hardware import select_platform

    selection = select_platform(emulate_without_device=True)
    return PlatformChoice(selection.emulation, selection.reason)


def run_demo(
    model: str | None = None,
    prompts: tuple[str, ...] | list[str] = DEFAULT_PROMPTS,
    max_tokens: int = 32,
    temperature: float = 0.0,
    seed: int = 0,
    in_process: bool = False,
    max_model_len: int = 512,
) -> DemoReport:
    """Start vLLM's engine through the plugin, generate, and report what served it.

    ``model``: a name in ``TINY_MODELS`` (None: ``DEFAULT_MODEL``) or a directory."""
    choice = choose_platform()
    if choice.emulation:
        os.environ[EMULATION_ENV] = "1"  # before vLLM resolves its platform
    if in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

    from vllm_kunlun.demo.serving_info import SERVING_INFO_METHOD, WORKER_EXTENSION
    from vllm_kunlun.demo.tiny_model import is_tiny_checkpoint

    model = model or DEFAULT_MODEL
    if model in TINY_MODELS:
        model_dir, model_kind = str(tiny_model_dir(model)), TINY_MODELS[model]
    else:
        model_dir, model_kind = model, "a model directory"
    # The tiny checkpoints (named, or one `vllm-kunlun tiny-model` wrote) are float32.
    tiny = is_tiny_checkpoint(model_dir)

    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams

    import_s = time.perf_counter() - t0
    kwargs: dict[str, Any] = {}
    if tiny:
        # vLLM's "auto" would downcast a float32 checkpoint to 16 bits.
        kwargs["dtype"] = "float32"
        if not choice.emulation:
            kwargs["kv_cache_memory_bytes"] = 1 << 30  # no 90 GB cache for it
    t0 = time.perf_counter()
    llm = LLM(
        model=model_dir,
        max_model_len=max_model_len,
        enforce_eager=True,
        seed=seed,
        worker_extension_cls=WORKER_EXTENSION,
        **kwargs,
    )
    engine_start_s = time.perf_counter() - t0

    params = SamplingParams(
        temperature=temperature, seed=seed, max_tokens=max_tokens, ignore_eos=True
    )
    # One short untimed request: the first step pays one-off costs (allocator, lazy
    # imports) that are no part of the steady-state rate.
    warm_up = params.clone()
    warm_up.max_tokens = 2
    llm.generate(list(prompts[:1]), warm_up, use_tqdm=False)
    t0 = time.perf_counter()
    outputs = llm.generate(list(prompts), params, use_tqdm=False)
    generate_s = time.perf_counter() - t0
    image_generation = None
    if sees_images(model_dir):
        (seen,) = llm.chat(image_messages(), params, use_tqdm=False)
        image_generation = Generation(
            prompt=f"[{IMAGE_SIZE[0]}x{IMAGE_SIZE[1]} image] {IMAGE_QUESTION}",
            text=seen.outputs[0].text,
            prompt_token_ids=list(seen.prompt_token_ids or []),
            token_ids=list(seen.outputs[0].token_ids),
            num_cached_tokens=int(seen.num_cached_tokens or 0),
        )
    serving = llm.collective_rpc(SERVING_INFO_METHOD)

    generations = [
        Generation(
            prompt=str(o.prompt),
            text=o.outputs[0].text,
            prompt_token_ids=list(o.prompt_token_ids or []),
            token_ids=list(o.outputs[0].token_ids),
            num_cached_tokens=int(o.num_cached_tokens or 0),
        )
        for o in outputs
    ]
    output_tokens = sum(len(g.token_ids) for g in generations)
    return DemoReport(
        platform_choice=choice.reason,
        emulation=choice.emulation,
        model=model_dir,
        model_kind=model_kind,
        engine_mode="in-process" if in_process else "multiprocessing",
        import_s=round(import_s, 3),
        engine_start_s=round(engine_start_s, 3),
        generate_s=round(generate_s, 3),
        prompt_tokens=sum(len(o.prompt_token_ids or []) for o in outputs),
        output_tokens=output_tokens,
        output_tokens_per_s=round(output_tokens / generate_s, 1) if generate_s else 0.0,
        generations=generations,
        image_generation=image_generation,
        serving=list(serving),
        demo_pid=os.getpid(),
    )
