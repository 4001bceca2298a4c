"""Engine start of the demo's models, side by side.

Why: the demo's default model is the deployment log's model in miniature (a tiny Qwen3.5
composite, hybrid, W8A8-INT8: ``vllm-kunlun demo``); its engine start must stay within
20% of the tiny dense Qwen3's (``--model qwen3``, the demo's model before), or a new user
waits for the plugin's model loading. The float tiny hybrid shows how much of a
difference the W8A8 layers make. vLLM also inspects an out-of-tree model class in a fresh
interpreter at every engine start unless the plugin's registry entry inspects it
in-process (``vllm_kunlun/models/inspection.py``); that once cost a hybrid 35 s more than
Qwen3 on the 2-core CI host. Measured: ``vllm-kunlun demo --in-process --json`` (host
emulation) per model, alternating, the median engine start (``LLM(...)`` construction,
``import vllm`` excluded) per model and each one's ratio to Qwen3's.

    python benchmarks/engine_start.py                 # 3 rounds
    python benchmarks/engine_start.py --rounds 5 --json out.json

Host emulation numbers measure the plugin's code paths on a CPU, not a Kunlun card.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASELINE = "qwen3"
# name -> the demo's --model: a named tiny model, or "tiny-model" flags for a directory.
MODELS: dict[str, list[str]] = {
    BASELINE: [],  # --model qwen3
    "qwen3_5 float": ["--arch", "qwen3_5"],  # a directory tiny-model writes
    "qwen3_5": [],  # the default: the W8A8 composite
}
NAMED = {BASELINE, "qwen3_5"}


def run_demo(model: str, out: Path, cache: Path) -> dict:
    env = {
        **os.environ,
        "VLLM_KUNLUN_HOST_EMULATION": "1",
        "XDG_CACHE_HOME": str(cache),
    }
    cmd = [sys.executable, "-m", "vllm_kunlun.cli", "demo", "--model", model]
    cmd += ["--in-process", "--max-tokens", "8", "--json-out", str(out), "--json"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"demo failed on {model}:\n{proc.stderr[-3000:]}")
    return dict(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, choices=range(1, 21))
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        paths = {}
        for name, flags in MODELS.items():
            if name in NAMED:
                paths[name] = name
                continue
            paths[name] = str(work / name.replace(" ", "-"))
            cmd = [sys.executable, "-m", "vllm_kunlun.cli", "tiny-model"]
            subprocess.run(
                [*cmd, paths[name], *flags], check=True, capture_output=True, cwd=REPO
            )
        starts: dict[str, list[float]] = {name: [] for name in MODELS}
        for r in range(args.rounds):
            for name in MODELS:
                out = work / f"{name.replace(' ', '-')}-{r}.json"
                report = run_demo(paths[name], out, work / "xdg")
                starts[name].append(float(report["engine_start_s"]))
                print(
                    f"round {r + 1}: {name:14s} engine start "
                    f"{report['engine_start_s']:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
    medians = {name: statistics.median(v) for name, v in starts.items()}
    ratios = {name: medians[name] / medians[BASELINE] for name in MODELS}
    print(f"{'model':14s} {'median engine start':>20s}  x {BASELINE}  runs")
    for name, values in starts.items():
        runs = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:14s} {medians[name]:>18.2f} s  {ratios[name]:5.2f}x  {runs}")
    print(f"load average {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"starts": starts, "medians": medians, "ratios": ratios})
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
