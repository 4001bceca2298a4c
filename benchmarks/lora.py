"""Multi-LoRA decode: output tok/s with 0, 1 and 4 active adapters against the base model.

Two engines, each in its own interpreter, measured in the same run on the same model
(a tiny Qwen3 widened to hidden 512, 4 layers, float32, so the LoRA products are not
lost in the engine's overhead):

* ``base``: no ``--enable-lora`` (the baseline);
* ``lora``: ``--enable-lora --max-loras 4 --max-lora-rank R`` with four hand-written
  adapters (peft layout, every attention and MLP projection), timed three ways:
  ``lora0`` (every request without an adapter), ``lora1`` (every request with the
  same adapter) and ``lora4`` (requests spread over the four adapters, every slot in
  use).

Per scenario, after a warm-up, each repeat times ``generate`` twice, greedy: T1 with
``max_tokens=1`` and T with ``max_tokens=M``, N requests in one batch. Reported
(medians over repeats): decode tok/s = N x (M - 1) / (T - T1), and the ratio to the
base engine (upstream's claim for its vendor kernels: "80%+ of non-LoRA performance").

    python benchmarks/lora.py                        # 16 x 32 tokens, rank 16
    python benchmarks/lora.py --num-seqs 32 --rank 64 --repeats 5 --json lora.json

Host emulation numbers measure the plugin's portable kernel on a CPU, not a Kunlun
card's vendor kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ADAPTERS = 4
SCENARIOS = {"lora0": 0, "lora1": 1, "lora4": ADAPTERS}  # name -> adapters in use
MODEL = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seqs", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--rank", type=int, default=16, choices=(8, 16, 32, 64))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.output_len < 2:
        parser.error("--output-len must be at least 2 (decode is what is timed)")
    return args


def assignment(adapters: int, num_seqs: int) -> list[int | None]:
    """The adapter index of each request (None: the base model), round robin."""
    return [None if adapters == 0 else i % adapters for i in range(num_seqs)]


def decode_tok_s(num_seqs: int, output_len: int, t1: float, t: float) -> float:
    """Decode throughput from one timing pair (T1: max_tokens=1, T: output_len)."""
    return num_seqs * (output_len - 1) / max(t - t1, 1e-9)


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One engine: each scenario's decode tok/s per repeat."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    lora = spec["lora"]
    kwargs: dict[str, Any] = {
        "dtype": "float32",
        "max_model_len": 512,
        "max_num_seqs": spec["num_seqs"],
        "seed": 0,
    }
    if lora:
        kwargs.update(enable_lora=True, max_loras=ADAPTERS, max_lora_rank=spec["rank"])
    llm = LLM(model=spec["model"], **kwargs)
    requests = [
        LoRARequest(f"a{i}", i + 1, path) for i, path in enumerate(spec["adapters"])
    ]
    prompts = [
        {
            "prompt_token_ids": [
                (7 * i + 3 * j) % 200 + 10 for j in range(spec["prompt_len"])
            ]
        }
        for i in range(spec["num_seqs"])
    ]
    out: dict[str, list[float]] = {}
    for name, count in (SCENARIOS if lora else {"base": 0}).items():
        loras = [
            None if a is None else requests[a]
            for a in assignment(count, spec["num_seqs"])
        ]

        def timed(max_tokens: int, loras: list[Any] = loras) -> float:
            params = SamplingParams(
                temperature=0.0, max_tokens=max_tokens, ignore_eos=True
            )
            start = time.perf_counter()
            llm.generate(prompts, params, lora_request=loras, use_tqdm=False)  # type: ignore[arg-type]
            return time.perf_counter() - start

        timed(spec["output_len"])  # warm-up (loads the adapters into their slots)
        out[name] = []
        for _ in range(spec["repeats"]):
            t1, t = timed(1), timed(spec["output_len"])
            out[name].append(decode_tok_s(spec["num_seqs"], spec["output_len"], t1, t))
    return out


def summarize(samples: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Median decode tok/s per scenario and its ratio to ``base``."""
    base = statistics.median(samples["base"])
    return [
        {
            "scenario": name,
            "adapters": SCENARIOS.get(name, 0),
            "decode_tok_s": round(statistics.median(values), 1),
            "vs_base": round(statistics.median(values) / base, 3),
            "samples": [round(v, 1) for v in values],
        }
        for name, values in samples.items()
    ]


def run_child(spec: dict[str, Any], work: Path) -> dict[str, list[float]]:
    path = work / f"{'lora' if spec['lora'] else 'base'}.json"
    path.write_text(json.dumps(spec))
    env = {**os.environ, "VLLM_KUNLUN_HOST_EMULATION": "1"}
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"engine failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print("RESULT " + json.dumps(child(json.loads(args.child.read_text()))))
        return 0
    from vllm_kunlun.demo.lora_adapters import write_adapter
    from vllm_kunlun.demo.tiny_model import TinyQwen3Spec, write_tiny_model

    with tempfile.TemporaryDirectory(prefix="lora-bench-") as tmp:
        work = Path(tmp)
        model = write_tiny_model(work / "model", TinyQwen3Spec(**MODEL))
        adapters = [
            str(
                write_adapter(
                    work / f"a{i}", model, rank=args.rank, alpha=args.rank, seed=i
                )
            )
            for i in range(ADAPTERS)
        ]
        spec = {
            "model": str(model),
            "adapters": adapters,
            "num_seqs": args.num_seqs,
            "prompt_len": args.prompt_len,
            "output_len": args.output_len,
            "rank": args.rank,
            "repeats": args.repeats,
        }
        samples = run_child({**spec, "lora": False}, work)
        samples.update(run_child({**spec, "lora": True}, work))
    rows = summarize(samples)
    print(f"{'scenario':<9} {'adapters':>8} {'decode tok/s':>13} {'vs base':>8}")
    for row in rows:
        print(
            f"{row['scenario']:<9} {row['adapters']:>8} {row['decode_tok_s']:>13.1f} "
            f"{row['vs_base']:>8.3f}"
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"json": str(args.json), "child": None},
                    "rows": rows,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
