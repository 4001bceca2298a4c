"""Serve hand-written LoRA adapters through vLLM's engine and transformers; JSON out.

Run by lora_runs.py (for test_e2e_lora.py and test_e2e_lora_hybrid.py) as ``python
lora_runner.py SPEC.json OUT.json`` in a fresh interpreter (an engine crash cannot take
pytest down). Spec: {"model": DIR,
"llm": {LLM kwargs}, "adapters": {name: {"path": DIR, "id": int}}, "requests":
[{"prompt": str, "adapter": name | null}], "max_tokens": int, "bad": [{"name": str,
"path": DIR, "id": int}], "hf": bool}. The engine generates the mixed batch greedily
(one ``LLM.generate``, one LoRARequest or None per prompt), each bad adapter is loaded
through the engine (``add_lora``, what ``/v1/load_lora_adapter`` calls) and its error
recorded, then the mixed batch runs again. With "hf", transformers generates every
request greedily on the base weights with that request's adapter merged in
(``W + alpha / r * B @ A``). Result: {"tokens": [[ids]], "prompt_ids": [[ids]],
"bad": {name: error | null}, "again": [[ids]], "hf": [[ids]], "served": [...],
"slot_bytes": [bytes of LoRA slots per rank]}.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any


def merged_state(model_dir: str, adapter_dir: str | None) -> dict[str, Any]:
    """The base checkpoint's tensors with the adapter merged: W + alpha / r * B @ A."""
    from safetensors.torch import load_file

    state = load_file(str(Path(model_dir) / "model.safetensors"))
    if adapter_dir is None:
        return state
    cfg = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
    scale = cfg["lora_alpha"] / cfg["r"]
    lora = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
    prefix = "base_model.model."
    for key, a in lora.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = key[len(prefix) : -len(".lora_A.weight")]
        b = lora[key.replace(".lora_A.", ".lora_B.")]
        weight = module + ".weight"
        state[weight] = state[weight] + scale * (b.double() @ a.double()).to(
            state[weight].dtype
        )
    return state


def hf_generate(
    model_dir: str, adapter_dir: str | None, prompts: list[list[int]], max_tokens: int
) -> list[list[int]]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_config(config).float()
    model.load_state_dict(merged_state(model_dir, adapter_dir))
    model.eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            seq = list(ids)
            for _ in range(max_tokens):  # greedy, recomputing the whole sequence
                logits = model(torch.tensor([seq])).logits[0, -1]
                seq.append(int(logits.argmax()))
            out.append(seq[len(ids) :])
    return out


def slot_bytes(model: Any) -> int:
    """Bytes of the LoRA slots vLLM allocated in this worker's model (A and B of every
    LoRA layer): the oracle for the budget's estimate."""
    total = 0
    for module in model.modules():
        for name in ("lora_a_stacked", "lora_b_stacked"):
            for t in getattr(module, name, None) or ():
                total += t.numel() * t.element_size()
    return total


def run(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    from vllm_kunlun.ops.lora import seam

    adapters = {
        name: LoRARequest(name, a["id"], a["path"])
        for name, a in spec["adapters"].items()
    }
    llm = LLM(model=spec["model"], enable_lora=True, **spec["llm"])
    params = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"])
    prompts = [r["prompt"] for r in spec["requests"]]
    loras = [adapters[r["adapter"]] if r["adapter"] else None for r in spec["requests"]]

    def batch() -> list[Any]:
        return llm.generate(prompts, params, lora_request=loras, use_tqdm=False)  # type: ignore[arg-type]

    outs = batch()
    result: dict[str, Any] = {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "prompt_ids": [list(o.prompt_token_ids) for o in outs],
        "bad": {},
    }
    for bad in spec.get("bad", []):
        try:
            llm.llm_engine.add_lora(LoRARequest(bad["name"], bad["id"], bad["path"]))
            result["bad"][bad["name"]] = None
        except Exception as exc:  # the refusal is the result
            result["bad"][bad["name"]] = f"{type(exc).__name__}: {exc}"
    result["again"] = [list(o.outputs[0].token_ids) for o in batch()]
    # By module name: TP workers unpickle it by importing this file (on their path).
    import lora_runner

    result["slot_bytes"] = llm.apply_model(lora_runner.slot_bytes)
    result["served"] = seam.served()
    if spec.get("hf"):
        paths = {name: a["path"] for name, a in spec["adapters"].items()}
        result["hf"] = [
            hf_generate(
                spec["model"],
                paths[r["adapter"]] if r["adapter"] else None,
                [ids],
                spec["max_tokens"],
            )[0]
            for r, ids in zip(spec["requests"], result["prompt_ids"], strict=True)
        ]
    return result


def main() -> None:
    spec_path, out_path = sys.argv[1], sys.argv[2]
    spec = json.loads(Path(spec_path).read_text())
    try:
        result = run(spec)
        result["error"] = None
    except BaseException:
        result = {"error": traceback.format_exc()}
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
