"""Run generation jobs through vLLM's engine (or transformers) and write JSON results.

Used by test_e2e_emulation.py as ``python e2e_runner.py SPEC.json OUT.json`` in a fresh
interpreter, so that an engine crash cannot take pytest down and its memory is returned.
The engine is started inside ``run_vllm`` (never at import): vLLM's engine processes are
spawned and re-import this file as their main module, which the ``__main__`` guard
keeps inert.

Spec: {"backend": "vllm" | "hf", "model": DIR, "llm": {LLM kwargs},
       "guard_exponential": bool (also runs the engine core in this process),
       "engine_in_process": bool (the engine core in this process, no guard),
       "rank_probe": int (tensor parallel: seed each rank's RNG differently from this
                     base and record every rank's sampled tokens, see RankProbe),
       "jobs": [{"name": str, "requests": [{"prompt": str, "max_tokens": int,
                 "sampling": {SamplingParams kwargs}, "image": bool}],
                 "expect_error": bool}],
       "hf_jobs": [jobs for a transformers greedy reference after the engine jobs],
       "hf_also": {"model": DIR, "jobs": [...]} (a reference on another checkpoint),
       "hf_cache": bool (reference decodes with transformers' cache, not recompute),
       "hf_attn": transformers' attn_implementation for the reference ("eager": its
                  modeling code's own attention, which alone applies Gemma 2's
                  soft-cap; default: transformers' choice),
       "metrics": bool (record vLLM's spec_decode counters after the jobs, and
                  after each job in "job_metrics": cumulative, job by job),
       "post": "module:function" run after the engine jobs with (spec, result),
       "distribution": [job names] (their sampled tokens against transformers'
                       distribution: sampling_reference.reference_pit)}
A request with "image" carries a small image (multi_modal_data); "images":
[[width, height, seed], ...] synthetic images and "video": [frames, width, height,
seed] a synthetic video (synthetic_image / synthetic_video), for the prompt's
placeholders; "hf_vl_jobs" are referenced by transformers' AutoProcessor and
AutoModelForImageTextToText on the same prompts and pixels (run_hf_vl). A job with
"expect_error" records the error vLLM raises for it instead of failing the run.
Result: {"jobs": {name: [{"prompt_token_ids", "token_ids", "text",
         "num_cached_tokens", "logprobs", "top_logprobs"}] or [{"error": str | None}]},
         "hf": {name: [...]}, "hf_also": {name: [...]}, "post": ...,
         "exponential_calls": [stack], "serving": [...], "metrics": {name: value},
         "job_metrics": {job name: {name: value} after it},
         "ranks": [RankProbe records, one per rank], "distribution": {name: [u]},
         "error": str | None}
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from typing import Any

from vllm_kunlun.demo.serving_info import ServingInfo

PROBE_EXTENSION = "e2e_runner.RankProbe"


class RankProbe(ServingInfo):
    """Test-only worker extension: what each tensor-parallel rank sampled.

    ``rank_probe_start`` seeds every rank's global RNG differently (as Kunlun ranks'
    device RNGs may differ) and wraps the plugin sampler's broadcast, recording each
    call's own draw (before) and the tokens the rank went on with (after). Workers
    import this module by name (spawned workers inherit this script's ``sys.path``).
    """

    def rank_probe_start(self, seed_base: int) -> None:
        import torch

        from vllm_kunlun.ops.sampling import topk_topp

        rank = int(self.rank)  # type: ignore[attr-defined]
        torch.manual_seed(seed_base + 1000 * rank)
        records: list[dict[str, list[int]]] = []
        broadcast = topk_topp.broadcast_from_first_rank

        def recording(tokens: torch.Tensor) -> torch.Tensor:
            own = tokens.view(-1).tolist()
            out = broadcast(tokens)
            records.append({"own": own, "used": out.view(-1).tolist()})
            return out

        topk_topp.broadcast_from_first_rank = recording  # type: ignore[assignment]
        self._rank_probe_records = records

    def rank_probe_result(self) -> dict[str, Any]:
        from vllm.distributed import get_tp_group

        communicator = type(get_tp_group().device_communicator)
        return {
            "rank": int(self.rank),  # type: ignore[attr-defined]
            "communicator": f"{communicator.__module__}.{communicator.__qualname__}",
            "records": self._rank_probe_records,
        }


class ExponentialCalled(RuntimeError):
    """Tensor.exponential_ ran: on Kunlun it has no device kernel (CPU fallback)."""


def install_exponential_guard(calls: list[str]) -> None:
    """Make every ``Tensor.exponential_`` in this process record its caller and fail."""
    import torch

    def guarded(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        stack = "".join(traceback.format_stack(limit=8)[:-1])
        calls.append(stack)
        raise ExponentialCalled(
            "Tensor.exponential_ was called during the run (it has no device kernel "
            "on Kunlun and silently runs on the CPU); caller:\n" + stack
        )

    torch.Tensor.exponential_ = guarded  # type: ignore[method-assign]


def run_vllm(spec: dict[str, Any]) -> dict[str, Any]:
    calls: list[str] = []
    if spec.get("guard_exponential") or spec.get("engine_in_process"):
        # The engine core in this process (and one process start less).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if spec.get("guard_exponential"):
        # The guard sees the engine core (the sampler runs there at TP 1).
        install_exponential_guard(calls)
    result: dict[str, Any] = {"jobs": {}, "exponential_calls": calls, "error": None}
    try:
        from vllm import LLM, SamplingParams

        from vllm_kunlun.demo.serving_info import SERVING_INFO_METHOD, WORKER_EXTENSION

        probe = spec.get("rank_probe")
        extension = WORKER_EXTENSION if probe is None else PROBE_EXTENSION
        llm = LLM(model=spec["model"], worker_extension_cls=extension, **spec["llm"])
        if probe is not None:
            llm.collective_rpc("rank_probe_start", args=(int(probe),))
        for job in spec["jobs"]:
            requests = job["requests"]
            params = [
                SamplingParams(
                    max_tokens=r["max_tokens"], ignore_eos=True, **r.get("sampling", {})
                )
                for r in requests
            ]
            prompts = [_prompt(r) for r in requests]
            if job.get("expect_error"):
                try:
                    llm.generate(prompts, params, use_tqdm=False)
                    error = None
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                result["jobs"][job["name"]] = [{"error": error}]
                continue
            outputs = llm.generate(prompts, params, use_tqdm=False)
            if spec.get("metrics"):
                result.setdefault("job_metrics", {})[job["name"]] = spec_counters(llm)
            result["jobs"][job["name"]] = [
                {
                    "prompt_token_ids": list(o.prompt_token_ids or []),
                    "token_ids": list(o.outputs[0].token_ids),
                    "text": o.outputs[0].text,
                    "num_cached_tokens": int(o.num_cached_tokens or 0),
                    "logprobs": chosen_logprobs(o.outputs[0]),
                    "top_logprobs": top_logprobs(o.outputs[0]),
                }
                for o in outputs
            ]
        if spec.get("metrics"):
            # vLLM's own counters (speculative decoding's drafts and acceptances);
            # the LLM needs disable_log_stats=False.
            result["metrics"] = spec_counters(llm)
        # After the jobs: the report counts the kernel calls that served them.
        result["serving"] = llm.collective_rpc(SERVING_INFO_METHOD)
        if probe is not None:
            result["ranks"] = llm.collective_rpc("rank_probe_result")
        # The engine is done: stop its processes (workers; Ray actors that poll their
        # channels while idle) before the references below run here on the same cores.
        llm.llm_engine.engine_core.shutdown()
        if spec.get("post"):
            # "module:function" next to this file, called as function(spec, result)
            # after the engine jobs (e.g. a reference model in the same interpreter).
            mod, fn = spec["post"].split(":")
            result["post"] = getattr(importlib.import_module(mod), fn)(spec, result)
        if spec.get("distribution"):
            # Sampled tokens against transformers' distribution (sampling_reference).
            from sampling_reference import reference_pit

            result["distribution"] = reference_pit(spec, result)
        if spec.get("hf_vl_jobs"):
            result["hf_vl"] = run_hf_vl({**spec, "jobs": spec["hf_vl_jobs"]})["jobs"]
        if spec.get("hf_jobs"):
            # transformers is already imported by vLLM: the reference costs only its
            # forward passes here.
            result["hf"] = run_hf({**spec, "jobs": spec["hf_jobs"]})["jobs"]
        if spec.get("hf_also"):
            result["hf_also"] = run_hf(spec["hf_also"])["jobs"]
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    return result


def spec_counters(llm: Any) -> dict[str, Any]:
    """vLLM's spec_decode counters (cumulative since the engine started)."""
    return {
        m.name: getattr(m, "value", None) or getattr(m, "values", None)
        for m in llm.get_metrics()
        if m.name.startswith("vllm:spec_decode")
    }


def chosen_logprobs(completion: Any) -> list[float] | None:
    """The logprob of each generated token (requests with ``logprobs`` set)."""
    if not completion.logprobs:
        return None
    return [
        float(step[tok].logprob)
        for tok, step in zip(completion.token_ids, completion.logprobs, strict=True)
    ]


def top_logprobs(completion: Any) -> list[list[list[float]]] | None:
    """Per generated token, ``[token id, logprob, rank]`` of every token vLLM returned
    for it: the ``logprobs`` most likely of the model's raw distribution and the
    sampled token (rank 1 is the most likely)."""
    if not completion.logprobs:
        return None
    return [
        [[tok, float(lp.logprob), int(lp.rank)] for tok, lp in step.items()]
        for step in completion.logprobs
    ]


def synthetic_image(width: int, height: int, seed: int) -> Any:
    """A deterministic RGB image: a colour gradient (different per seed) plus noise,
    so that neighbouring patches differ and the tower's output depends on them."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = rng.uniform(0, 255, 3)
    slope = rng.uniform(-3, 3, (2, 3))
    img = base + x[..., None] * slope[0] + y[..., None] * slope[1]
    img = img + rng.normal(0, 25, (height, width, 3))
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def synthetic_video(
    frames: int, width: int, height: int, seed: int
) -> tuple[Any, dict[str, Any]]:
    """(frames, height, width, 3) uint8 frames drifting over time, and the metadata
    vLLM's Qwen-VL video path needs (frames already sampled, 2 fps)."""
    import numpy as np

    first = np.asarray(synthetic_image(width, height, seed), dtype=np.int16)
    video = np.stack(
        [np.clip(first + 20 * i, 0, 255).astype(np.uint8) for i in range(frames)]
    )
    metadata = {
        "fps": 2.0,
        "duration": frames / 2.0,
        "total_num_frames": frames,
        "frames_indices": list(range(frames)),
        "video_backend": "opencv",
        "do_sample_frames": False,
    }
    return video, metadata


def _prompt(request: dict[str, Any]) -> Any:
    if request.get("images") or request.get("video"):
        data: dict[str, Any] = {}
        if request.get("images"):
            data["image"] = [synthetic_image(*i) for i in request["images"]]
        if request.get("video"):
            data["video"] = synthetic_video(*request["video"])
        return {"prompt": request["prompt"], "multi_modal_data": data}
    if not request.get("image"):
        return request["prompt"]
    from PIL import Image

    image = Image.new("RGB", (32, 32), color=(200, 30, 30))
    return {"prompt": request["prompt"], "multi_modal_data": {"image": image}}


def greedy_vl(model: Any, inputs: Any, max_tokens: int) -> list[int]:
    """transformers' cached greedy decoding of one processed prompt (its pixels in
    the prefill, then one token per step), argmax without an EOS stop."""
    import torch

    # Its M-RoPE offset is cached on the model between calls: a new prompt starts
    # without one (a text-only prompt would inherit the last image's).
    model.model.rope_deltas = None
    out: list[int] = []
    with torch.no_grad():
        step = model(**inputs, use_cache=True)
        for _ in range(max_tokens):
            nxt = int(step.logits[0, -1].argmax())
            out.append(nxt)
            step = model(
                input_ids=torch.tensor([[nxt]]),
                past_key_values=step.past_key_values,
                use_cache=True,
            )
    return out


def run_hf_vl(spec: dict[str, Any]) -> dict[str, Any]:
    """Greedy reference for image/video prompts: transformers' own processor and
    model (float32), one request at a time, its cached decoding (prefill with the
    pixels, then one token per step), argmax without an EOS stop."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from transformers.video_utils import VideoMetadata

    processor = AutoProcessor.from_pretrained(spec["model"])
    model = AutoModelForImageTextToText.from_pretrained(
        spec["model"], dtype=torch.float32
    )
    model.eval()
    result: dict[str, Any] = {"jobs": {}, "error": None}
    for job in spec["jobs"]:
        rows = []
        for r in job["requests"]:
            kwargs: dict[str, Any] = {}
            if r.get("images"):
                kwargs["images"] = [synthetic_image(*i) for i in r["images"]]
            if r.get("video"):
                video, meta = synthetic_video(*r["video"])
                kwargs["videos"] = [video]
                fields = {k: v for k, v in meta.items() if k != "do_sample_frames"}
                kwargs["video_metadata"] = [VideoMetadata(**fields)]
                kwargs["do_sample_frames"] = False
            inputs = processor(text=[r["prompt"]], return_tensors="pt", **kwargs)
            out = greedy_vl(model, inputs, r["max_tokens"])
            prompt_ids = inputs["input_ids"][0].tolist()
            rows.append(
                {
                    "prompt_token_ids": prompt_ids,
                    "token_ids": out,
                }
            )
        result["jobs"][job["name"]] = rows
    return result


def run_hf(spec: dict[str, Any]) -> dict[str, Any]:
    """Greedy reference: full recompute each step, float32, argmax of the last logit."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    attn = {"attn_implementation": spec["hf_attn"]} if spec.get("hf_attn") else {}
    model = AutoModelForCausalLM.from_pretrained(
        spec["model"], dtype=torch.float32, **attn
    )
    model.eval()
    result: dict[str, Any] = {"jobs": {}, "error": None}
    for job in spec["jobs"]:
        rows = []
        for r in job["requests"]:
            prompt_ids = tokenizer(r["prompt"])["input_ids"]
            ids = torch.tensor([prompt_ids])
            out: list[int] = []
            with torch.no_grad():
                if spec.get("hf_cache"):
                    # transformers' own cached decoding (its hybrid cache for Qwen3.5:
                    # chunked prefill once, then the recurrent step per token).
                    step = model(ids, use_cache=True)
                    for _ in range(r["max_tokens"]):
                        nxt = int(step.logits[0, -1].argmax())
                        out.append(nxt)
                        step = model(
                            torch.tensor([[nxt]]),
                            past_key_values=step.past_key_values,
                            use_cache=True,
                        )
                    rows.append({"prompt_token_ids": prompt_ids, "token_ids": out})
                    continue
                for _ in range(r["max_tokens"]):
                    nxt = int(model(ids).logits[0, -1].argmax())
                    out.append(nxt)
                    ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
            rows.append({"prompt_token_ids": prompt_ids, "token_ids": out})
        result["jobs"][job["name"]] = rows
    return result


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    with open(spec_path) as f:
        spec = json.load(f)
    result = run_hf(spec) if spec["backend"] == "hf" else run_vllm(spec)
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 1 if result.get("error") else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
