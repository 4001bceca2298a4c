"""Embed through vLLM's engine (``LLM(runner="pooling")``), then transformers' reference
in the same interpreter; write JSON results.

Used by test_e2e_pooling.py as ``python pooling_runner.py SPEC.json OUT.json`` in a fresh
interpreter (an engine crash cannot take pytest down). The engine core runs in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and is shut down before the reference.

Spec: {"model": DIR, "kind": "decoder" | "encoder", "llm": {LLM kwargs},
       "batches": [[[token ids], ...], ...] (each one ``LLM.embed`` call),
       "score": [query text, [document texts]] (``LLM.score``, optional)}
Result: {"vllm": [[vector, ...] per batch], "hf": [...] (same layout),
         "score": [floats], "hf_score": [floats], "backends": [...], "error": str | None}
The reference: ``AutoModel`` (``Qwen3Model`` / ``XLMRobertaModel``, float32), one prompt
at a time, the last token's (decoder) or the first token's (encoder) final hidden state,
L2-normalized, as the checkpoints' sentence-transformers files say.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any


def reference(spec: dict[str, Any], prompts: list[list[int]]) -> list[list[float]]:
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(spec["model"], dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            row = hidden[-1] if spec["kind"] == "decoder" else hidden[0]
            out.append(torch.nn.functional.normalize(row, dim=-1).tolist())
    return out


def run(spec: dict[str, Any]) -> dict[str, Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    result: dict[str, Any] = {"vllm": [], "hf": [], "error": None}
    try:
        from vllm import LLM
        from vllm.inputs import TokensPrompt

        from vllm_kunlun.demo.serving_info import SERVING_INFO_METHOD, WORKER_EXTENSION

        llm = LLM(
            model=spec["model"],
            runner="pooling",
            worker_extension_cls=WORKER_EXTENSION,
            **spec["llm"],
        )
        for batch in spec["batches"]:
            outs = llm.embed(
                [TokensPrompt(prompt_token_ids=ids) for ids in batch], use_tqdm=False
            )
            result["vllm"].append([o.outputs.embedding for o in outs])
        if spec.get("score"):
            query, docs = spec["score"]
            outs = llm.score(query, docs, use_tqdm=False)
            result["score"] = [o.outputs.score for o in outs]
        result["serving"] = llm.collective_rpc(SERVING_INFO_METHOD)
        llm.llm_engine.engine_core.shutdown()
        result["hf"] = [reference(spec, batch) for batch in spec["batches"]]
        if spec.get("score"):
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(spec["model"])
            query, docs = spec["score"]
            ids = [tok(t)["input_ids"] for t in [query, *docs]]
            vecs = reference(spec, ids)
            result["hf_score"] = [
                sum(a * b for a, b in zip(vecs[0], v, strict=True)) for v in vecs[1:]
            ]
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    return result


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    with open(spec_path) as f:
        spec = json.load(f)
    result = run(spec)
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 1 if result.get("error") else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
