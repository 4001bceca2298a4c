"""Engine start of the tiny Qwen3.5 hybrid against the tiny Qwen3, side by side.

Why: vLLM inspects an out-of-tree model class in a fresh interpreter at every engine
start unless the plugin's registry entry inspects it in-process
(``vllm_kunlun/models/inspection.py``); a hybrid engine start then cost 35 s more than
Qwen3's on the 2-core CI host. This measures what a user waits for: ``vllm-kunlun demo
--in-process --json`` (host emulation) on each checkpoint, alternating, and reports the
median engine start (``LLM(...)`` construction, ``import vllm`` excluded) per model and
the hybrid's ratio to Qwen3's.

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
MODELS = {"qwen3": [], "qwen3_5": ["--arch", "qwen3_5"]}


def run_demo(model_dir: Path, out: Path) -> dict:
    env = {**os.environ, "VLLM_KUNLUN_HOST_EMULATION": "1"}
    cmd = [sys.executable, "-m", "vllm_kunlun.cli", "demo", "--model", str(model_dir)]
    cmd += ["--in-process", "--max-tokens", "8", "--json-out", str(out), "--json"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"demo failed on {model_dir}:\n{proc.stderr[-3000:]}")
    return dict(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, choices=range(1, 21))
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, flags in MODELS.items():
            cmd = [sys.executable, "-m", "vllm_kunlun.cli", "tiny-model"]
            subprocess.run(
                [*cmd, str(work / name), *flags],
                check=True,
                capture_output=True,
                cwd=REPO,
            )
        starts: dict[str, list[float]] = {name: [] for name in MODELS}
        for r in range(args.rounds):
            for name in MODELS:
                report = run_demo(work / name, work / f"{name}-{r}.json")
                starts[name].append(float(report["engine_start_s"]))
                print(
                    f"round {r + 1}: {name:8s} engine start "
                    f"{report['engine_start_s']:.2f} s",
                    file=sys.stderr,
                )
    medians = {name: statistics.median(v) for name, v in starts.items()}
    ratio = medians["qwen3_5"] / medians["qwen3"]
    print(f"{'model':10s} {'median engine start':>20s}  runs")
    for name, values in starts.items():
        runs = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:10s} {medians[name]:>18.2f} s  {runs}")
    print(f"qwen3_5 / qwen3: {ratio:.2f}x (load average {os.getloadavg()[0]:.2f})")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"starts": starts, "medians": medians, "ratio": ratio})
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
