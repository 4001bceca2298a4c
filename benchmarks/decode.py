"""Decode at the deployment log's scale: N concurrent sequences, a 151,936-token vocabulary.

The log's throughput problem (docs/deployment-log.md D11) was decode at 256 concurrent requests: 32 output tok/s
with vLLM's own sampler (its ``exponential_`` noise ran on the CPU), 3,201 once sampling
stayed on the device. This benchmark reproduces that shape with vLLM's engine and the
plugin: N requests (default 256) with short prompts and long outputs, random sampling
(temperature 1) over a 151,936-token vocabulary, all in one batch.

Engines, each in its own interpreter, measured in the same run:

* host emulation (default): the tiny Qwen3 with a 151,936-token vocabulary on the CPU,
  ``ours`` (the plugin's sampler) and ``native`` (vLLM's ``TopKTopPSampler``, the
  sampler of the log's stall: the plugin's worker installs ours in every model process,
  so this engine's worker puts vLLM's back through the serving-info worker extension).
  The served sampler is read back from the worker and checked.
* ``--device cuda`` (a lent GPU): KunlunPlatform forced on CUDA (the test-only
  torch_xmlir reports one device), ``graphs`` (piecewise CUDA graphs; needs the
  patch_torch251 set applied) and ``eager`` (``enforce_eager``), both with our sampler.
  The worker reports how many graphs it captured.

Per engine, after a warm-up, each repeat times ``generate`` twice: T1 with
``max_tokens=1`` (prefill and the first token) and T with ``max_tokens=M``. Reported
(medians over repeats): output tok/s = N x M / T, decode ms/step = (T - T1) / (M - 1),
and the ratio of each engine's output tok/s to the baseline's (native / eager).

    python benchmarks/decode.py                          # 256 x 64 tokens, emulation
    python benchmarks/decode.py --num-seqs 64 --output-len 32 --repeats 2
    python benchmarks/decode.py --device cuda --json out.json
    python benchmarks/decode.py --plot decode.png        # and a picture (matplotlib)

``--spec mtp``: MTP speculative decoding instead of the sampler comparison. Engines
``mtp1``, ``mtp2``, ``mtp3`` (1, 2, 3 speculative tokens) and ``none`` (no speculation,
the baseline) serve the tiny Qwen3.5 composite whose MTP head is trained
(``vllm-kunlun tiny-model --arch qwen3_5 --mtp``), greedy, on prompts of its synthetic
language (default 4 sequences, 16-word prompts, 64 tokens). Besides output tok/s each
row reports the acceptance from vLLM's spec-decode counters (accepted / drafted tokens,
and the mean accepted length per step, the bonus token included).

    python benchmarks/decode.py --spec mtp --repeats 3

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
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
VOCAB = 151_936
NATIVE_FORWARD = "vllm.v1.sample.ops.topk_topp_sampler.TopKTopPSampler.forward_native"
OURS_FORWARD = "vllm_kunlun.ops.sampling.topk_topp.KunlunTopKTopPSampler.forward"


@dataclass(frozen=True)
class Engine:
    """One engine configuration: what it is called, its environment, its LLM args."""

    name: str
    sampler: str  # "ours" or "native"
    graphs: bool
    env: dict[str, str] = field(default_factory=dict)
    llm: dict[str, Any] = field(default_factory=dict)


SPEC_TOKENS = (1, 2, 3)


def spec_engines(args: argparse.Namespace) -> list[Engine]:
    """``--spec mtp``: one engine per number of speculative tokens, then none.

    One torch thread each: four engines share the host, and the tiny model gains
    nothing from more (less noise between alternating runs)."""
    env = {"VLLM_KUNLUN_HOST_EMULATION": "1", "OMP_NUM_THREADS": "1"}
    llm: dict[str, Any] = {
        "max_num_seqs": args.num_seqs,
        "max_model_len": args.prompt_len + args.output_len + 16,
        "max_num_batched_tokens": max(args.num_seqs * args.prompt_len, 512),
        "enable_prefix_caching": False,
        "seed": 0,
        "dtype": "float32",
        "enforce_eager": True,
        "disable_log_stats": False,  # the spec-decode counters
    }
    out = [
        Engine(
            f"mtp{n}",
            "ours",
            False,
            env,
            {
                **llm,
                "speculative_config": {"method": "mtp", "num_speculative_tokens": n},
            },
        )
        for n in SPEC_TOKENS
    ]
    return [*out, Engine("none", "ours", False, env, llm)]


def engines(args: argparse.Namespace) -> list[Engine]:
    """The engines to compare; the last one is the baseline of the ratio."""
    if getattr(args, "spec", None) == "mtp":
        return spec_engines(args)
    common: dict[str, Any] = {
        "max_num_seqs": args.num_seqs,
        "max_model_len": args.prompt_len + args.output_len + 16,
        "max_num_batched_tokens": max(args.num_seqs * args.prompt_len, 512),
        "enable_prefix_caching": False,
        "seed": 0,
    }
    if args.device == "cpu":
        env = {"VLLM_KUNLUN_HOST_EMULATION": "1"}
        llm = {**common, "dtype": "float32", "enforce_eager": True}
        return [
            Engine("ours", "ours", False, env, llm),
            Engine("native", "native", False, env, llm),
        ]
    fakes = str(REPO / "tests" / "fakes")
    path = os.pathsep.join(filter(None, [fakes, os.environ.get("PYTHONPATH")]))
    env = {"FAKE_XMLIR_DEVICES": "1", "PYTHONPATH": path}
    llm = {
        **common,
        "dtype": args.dtype,
        "kv_cache_memory_bytes": 4 << 30,
        "attention_backend": args.attention_backend,
    }
    return [
        Engine("graphs", "ours", True, env, {**llm, "enforce_eager": False}),
        Engine("eager", "ours", False, env, {**llm, "enforce_eager": True}),
    ]


def prompts(count: int, length: int) -> list[str]:
    """``count`` different prompts of ``length`` words from the tiny vocabulary."""
    sys.path.insert(0, str(REPO))
    from vllm_kunlun.demo.tiny_model import vocabulary

    words = [w for w in vocabulary() if w.isalpha()]
    n = len(words)

    def word(i: int, j: int) -> str:
        # The first two words spell i in base n (distinct prompts), then filler.
        return words[(i // n**j) % n if j < 2 else (i * 7 + j * 13) % n]

    return [" ".join(word(i, j) for j in range(length)) for i in range(count)]


def summarize(
    t1: list[float], tm: list[float], num_seqs: int, output_len: int
) -> dict[str, float]:
    """Medians over repeats: output tok/s, decode ms/step (prefill taken out)."""
    first, full = statistics.median(t1), statistics.median(tm)
    steps = max(output_len - 1, 1)
    return {
        "t1_s": first,
        "t_s": full,
        "output_tok_s": num_seqs * output_len / full,
        "decode_ms_per_step": 1000.0 * max(full - first, 0.0) / steps,
    }


def check_served(engine: Engine, info: dict[str, Any]) -> None:
    """Refuse a result whose worker ran something else than the engine's name says."""
    want = OURS_FORWARD if engine.sampler == "ours" else NATIVE_FORWARD
    if info.get("topk_topp_forward") != want:
        raise RuntimeError(
            f"engine {engine.name}: the worker sampled with "
            f"{info.get('topk_topp_forward')}, expected {want}; the comparison would "
            "be meaningless"
        )
    captured = int(info.get("cudagraphs_captured") or 0)
    if engine.graphs and captured == 0:
        raise RuntimeError(
            f"engine {engine.name}: no CUDA graph was captured (cudagraph mode "
            f"{info.get('cudagraph_mode')}); see the engine log for the reason (the "
            "patch_torch251 set must be applied: vllm-kunlun patch apply)"
        )
    if not engine.graphs and captured:
        raise RuntimeError(f"engine {engine.name}: {captured} graphs captured")


# ---- child: one engine in this interpreter, driven over stdin/stdout ----------------


def serve_child(spec: dict[str, Any]) -> None:
    """Start the engine, then answer one line per command: ``run N`` (seconds for
    generating N tokens per prompt), ``info`` (the worker's serving info), ``quit``.

    Engines stay up side by side and the parent alternates its timed runs between
    them, so a change in machine load hits every engine alike.
    """
    from vllm import LLM, SamplingParams

    from vllm_kunlun.demo.serving_info import (
        SERVING_INFO_METHOD,
        USE_VLLM_SAMPLER_METHOD,
        WORKER_EXTENSION,
    )

    start = time.perf_counter()
    llm = LLM(model=spec["model"], worker_extension_cls=WORKER_EXTENSION, **spec["llm"])
    if spec.get("vllm_sampler"):
        llm.collective_rpc(USE_VLLM_SAMPLER_METHOD)
    reply({"ready": time.perf_counter() - start})
    if spec.get("language"):  # --spec mtp: the trained model's own language
        from vllm_kunlun.demo.tiny_qwen3_5_mtp import language_prompts

        texts = language_prompts([spec["prompt_len"]] * spec["num_seqs"])
    else:
        texts = prompts(spec["num_seqs"], spec["prompt_len"])
    sampling = {"temperature": 1.0, "ignore_eos": True, **spec["sampling"]}
    for line in sys.stdin:
        command, *rest = line.split()
        if command == "run":
            max_tokens = int(rest[0])
            params = SamplingParams(max_tokens=max_tokens, **sampling)
            t0 = time.perf_counter()
            outs = llm.generate(texts, params, use_tqdm=False)
            elapsed = time.perf_counter() - t0
            got = sum(len(o.outputs[0].token_ids) for o in outs)
            reply({"seconds": elapsed, "tokens": got})
        elif command == "info":
            (info,) = llm.collective_rpc(SERVING_INFO_METHOD)
            reply({"info": info})
        elif command == "metrics":
            reply({"metrics": spec_metrics(llm)})
        else:
            return


def spec_metrics(llm: Any) -> dict[str, Any]:
    """vLLM's spec-decode counters (cumulative since the engine started)."""
    return {
        m.name: getattr(m, "value", None) or getattr(m, "values", None)
        for m in llm.get_metrics()
        if m.name.startswith("vllm:spec_decode")
    }


def acceptance(metrics: dict[str, Any]) -> dict[str, float] | None:
    """Accepted / drafted tokens and the mean tokens per verification step (accepted
    drafts plus the token the target adds), from ``spec_metrics``."""
    drafted = metrics.get("vllm:spec_decode_num_draft_tokens") or 0
    steps = metrics.get("vllm:spec_decode_num_drafts") or 0
    if not drafted or not steps:
        return None
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens") or 0
    return {
        "acceptance_rate": accepted / drafted,
        "mean_accepted_length": 1 + accepted / steps,
    }


REPLY = "DECODE-BENCH "


def reply(obj: dict[str, Any]) -> None:
    print(REPLY + json.dumps(obj), flush=True)


# ---- parent ------------------------------------------------------------------------------


def model_dir(args: argparse.Namespace) -> str:
    if args.model:
        return args.model
    sys.path.insert(0, str(REPO))
    from vllm_kunlun.demo.tiny_model import (
        TinyQwen3Spec,
        default_cache_dir,
        ensure_tiny_model,
    )

    if getattr(args, "spec", None) == "mtp":
        from vllm_kunlun.demo.tiny_qwen3_5_mtp import TinyQwen3_5MtpSpec

        mtp = TinyQwen3_5MtpSpec()
        return str(ensure_tiny_model(default_cache_dir(mtp), mtp))
    target = default_cache_dir().with_name(f"tiny-qwen3-vocab{VOCAB}")
    return str(ensure_tiny_model(target, TinyQwen3Spec(vocab_size=VOCAB)))


def child_spec(engine: Engine, args: argparse.Namespace, model: str) -> dict[str, Any]:
    """What one engine's child process runs (written to its spec file)."""
    return {
        "model": model,
        "llm": engine.llm,
        # The plugin's worker installs our sampler in every model process: the native
        # engine's child puts vLLM's back (serving_info's worker extension).
        "vllm_sampler": engine.sampler == "native",
        "num_seqs": args.num_seqs,
        "prompt_len": args.prompt_len,
        "language": getattr(args, "spec", None) == "mtp",
        "sampling": {
            k: v
            for k, v in (
                ("top_k", args.top_k),
                ("top_p", args.top_p),
                # --spec mtp decodes greedily: the same tokens with and without it.
                ("temperature", 0.0 if getattr(args, "spec", None) else None),
            )
            if v is not None
        },
    }


class Child:
    """One engine process and its log; ``ask`` sends a command and reads the reply."""

    def __init__(
        self, engine: Engine, args: argparse.Namespace, model: str, work: Path
    ) -> None:
        self.engine = engine
        spec = child_spec(engine, args, model)
        spec_path = work / f"{engine.name}.spec.json"
        spec_path.write_text(json.dumps(spec))
        env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
        # Logs go to the log file; stdout carries only the replies.
        env.update(engine.env, VLLM_LOGGING_STREAM="ext://sys.stderr")
        self.log_path = work / f"{engine.name}.log"
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", str(spec_path)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log_path.open("w"),
            text=True,
        )
        self.start_s = float(self.read()["ready"])

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                return dict(json.loads(line[len(REPLY) :]))
        tail = self.log_path.read_text()[-3000:]
        raise SystemExit(
            f"engine {self.engine.name} exited (code {self.proc.wait()}):\n{tail}"
        )

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()

    def run(self, max_tokens: int, num_seqs: int) -> float:
        got = self.ask(f"run {max_tokens}")
        if got["tokens"] != num_seqs * max_tokens:
            raise RuntimeError(
                f"engine {self.engine.name}: {got['tokens']} tokens, expected "
                f"{num_seqs * max_tokens}"
            )
        return float(got["seconds"])

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def measure(children: list[Child], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Warm up every engine, then alternate the timed runs between them."""
    n, m = args.num_seqs, args.output_len
    for child in children:
        child.run(min(4, m), n)
    t1: dict[str, list[float]] = {c.engine.name: [] for c in children}
    tm: dict[str, list[float]] = {c.engine.name: [] for c in children}
    for _ in range(args.repeats):
        for child in children:
            t1[child.engine.name].append(child.run(1, n))
            tm[child.engine.name].append(child.run(m, n))
    rows = []
    for child in children:
        e = child.engine
        info = child.ask("info")["info"]
        check_served(e, info)
        spec = e.llm.get("speculative_config")
        extra: dict[str, Any] = {}
        if spec is not None:
            metrics = child.ask("metrics")["metrics"]
            extra = {
                "num_speculative_tokens": spec["num_speculative_tokens"],
                "spec_metrics": metrics,
                **(acceptance(metrics) or {}),
            }
        rows.append(
            {
                "engine": e.name,
                "sampler": e.sampler,
                "graphs": e.graphs,
                "num_seqs": n,
                "prompt_len": args.prompt_len,
                "output_len": m,
                "engine_start_s": child.start_s,
                "t1_runs_s": t1[e.name],
                "t_runs_s": tm[e.name],
                **summarize(t1[e.name], tm[e.name], n, m),
                "serving": info,
                **extra,
            }
        )
    return rows


def spec_table(rows: list[dict[str, Any]], baseline: str) -> str:
    base = next(r for r in rows if r["engine"] == baseline)["output_tok_s"]
    lines = [
        "| engine | speculative tokens | sequences | prompt/output | output tok/s | "
        "acceptance | mean accepted length | vs " + baseline + " |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        n = r.get("num_speculative_tokens")
        rate = r.get("acceptance_rate")
        length = r.get("mean_accepted_length")
        lines.append(
            f"| {r['engine']} | {n or 0} | {r['num_seqs']} | "
            f"{r['prompt_len']}/{r['output_len']} | {r['output_tok_s']:.1f} | "
            f"{'-' if rate is None else f'{rate:.0%}'} | "
            f"{'-' if length is None else f'{length:.2f}'} | "
            f"{r['output_tok_s'] / base:.2f}x |"
        )
    return "\n".join(lines)


def table(rows: list[dict[str, Any]], baseline: str) -> str:
    if any("num_speculative_tokens" in r for r in rows):
        return spec_table(rows, baseline)
    base = next(r for r in rows if r["engine"] == baseline)["output_tok_s"]
    lines = [
        "| engine | sampler | graphs | sequences | prompt/output | output tok/s | "
        "decode ms/step | vs " + baseline + " |",
        "|---|---|---|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['engine']} | {r['sampler']} | {'on' if r['graphs'] else 'off'} | "
            f"{r['num_seqs']} | {r['prompt_len']}/{r['output_len']} | "
            f"{r['output_tok_s']:.1f} | {r['decode_ms_per_step']:.1f} | "
            f"{r['output_tok_s'] / base:.2f}x |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """Output tok/s and decode ms/step per engine (ours / native, or graphs / eager
    on CUDA), the numbers ``table`` prints."""
    plots = load_plots()
    first, base = rows[0], rows[-1]
    title = (
        f"decode: {first['num_seqs']} sequences, prompt/output "
        f"{first['prompt_len']}/{first['output_len']}, median of "
        f"{len(first['t_runs_s'])}"
        + "".join(
            f"; {r['engine']} = {r['output_tok_s'] / base['output_tok_s']:.2f}x "
            f"{base['engine']}"
            for r in rows[:-1]
        )
    )
    tok_s, step_ms = "output tok/s", "decode ms/step"
    table = plots.Table(
        title=title,
        columns=["engine", tok_s, step_ms],
        rows=[[r["engine"], r["output_tok_s"], r["decode_ms_per_step"]] for r in rows],
    )
    panels = [plots.Panel([tok_s], tok_s), plots.Panel([step_ms], step_ms)]
    return Path(plots.draw(path, table, panels))


def load_plots() -> ModuleType:
    """benchmarks/plots.py, loaded only for --plot: it needs matplotlib, an extra."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import plots

    return plots


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--spec",
        choices=("mtp",),
        help="mtp: MTP speculative decoding with 1, 2, 3 tokens against none (the "
        "trained tiny Qwen3.5, host emulation, greedy)",
    )
    parser.add_argument(
        "--num-seqs", type=int, help="concurrent sequences (256; 4 with --spec)"
    )
    parser.add_argument(
        "--prompt-len", type=int, help="words per prompt (8; 16 with --spec)"
    )
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", default="bfloat16", help="cuda only")
    parser.add_argument("--attention-backend", default="TRITON_ATTN", help="cuda only")
    parser.add_argument("--top-k", type=int, help="per-request top-k (default none)")
    parser.add_argument("--top-p", type=float, help="per-request top-p (default none)")
    parser.add_argument("--model", help="model directory (default: the tiny Qwen3)")
    parser.add_argument(
        "--engines",
        default="",
        help="comma-separated subset: ours, native (cpu); graphs, eager (cuda); "
        "mtp1, mtp2, mtp3, none (--spec mtp)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--plot",
        type=Path,
        help="also draw output tok/s and decode ms/step per engine into this PNG; "
        "needs matplotlib (pip install 'vllm-kunlun[bench]')",
    )
    args = parser.parse_args(argv)
    if args.num_seqs is None:
        args.num_seqs = 4 if args.spec else 256
    if args.prompt_len is None:
        args.prompt_len = 16 if args.spec else 8
    if args.spec and args.device != "cpu":
        parser.error("--spec mtp runs in host emulation (--device cpu)")
    valid = [e.name for e in engines(args)]
    unknown = [n for n in _names(args.engines) if n not in valid]
    if unknown:
        parser.error(
            f"unknown engine(s) {', '.join(map(repr, unknown))} for --device "
            f"{args.device}; valid engines: {', '.join(map(repr, valid))}"
        )
    if args.plot and (error := load_plots().problem(args.plot)):
        parser.error(error)
    return args


def _names(spec: str) -> list[str]:
    return [n.strip() for n in spec.split(",") if n.strip()]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        serve_child(json.loads(Path(argv[1]).read_text()))
        return 0
    args = parse_args(argv)
    chosen = engines(args)
    if args.engines:
        wanted = _names(args.engines)
        chosen = [e for e in chosen if e.name in wanted]
    model = model_dir(args)
    children: list[Child] = []
    with tempfile.TemporaryDirectory(prefix="vllm-kunlun-decode-") as tmp:
        try:
            for engine in chosen:
                print(f"==> starting engine {engine.name}", flush=True)
                children.append(Child(engine, args, model, Path(tmp)))
            print(
                f"==> {args.repeats} x (1 and {args.output_len} tokens) for "
                f"{args.num_seqs} sequences, alternating engines",
                flush=True,
            )
            rows = measure(children, args)
        finally:
            for child in children:
                child.close()
    print(table(rows, baseline=rows[-1]["engine"]))
    for r in rows:
        if "spec_metrics" in r:
            print(f"{r['engine']}: vLLM spec-decode counters {r['spec_metrics']}")
        print(
            f"{r['engine']}: engine start {r['engine_start_s']:.1f} s; T1 runs "
            f"{_secs(r['t1_runs_s'])}; T runs {_secs(r['t_runs_s'])}; served by "
            f"{r['serving'].get('topk_topp_forward')}, graphs "
            f"{r['serving'].get('cudagraph_mode')} "
            f"({r['serving'].get('cudagraphs_captured')} captured)"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {
                        **vars(args),
                        "json": str(args.json),
                        "plot": str(args.plot or ""),
                    },
                    "rows": rows,
                }
            )
        )
    if args.plot:
        plot(rows, args.plot)
    return 0


def _secs(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    sys.exit(main())
