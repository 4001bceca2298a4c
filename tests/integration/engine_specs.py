"""Helpers the integration tests share: the engine settings and requests of the
end-to-end runs, one builder of the spec ``e2e_runner.py`` reads (``engine_spec``),
running it in a fresh interpreter (``run_spec``), and the ``vllm-kunlun demo`` command
(``run_demo_cli``). A helpers module, not a test file: importing it collects no tests.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import child_env, run_bounded
from vllm_kunlun.demo.tiny_model import vocabulary

# A tiny Qwen3 config.json (no weights): for the tests of engine config alone.
TINY_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

RUNNER = Path(__file__).with_name("e2e_runner.py")
EMULATION = {"VLLM_KUNLUN_HOST_EMULATION": "1", "VLLM_LOGGING_LEVEL": "INFO"}

BLOCK_SIZE = 16
TOKEN_BUDGET = 32  # max_num_batched_tokens: longer prompts are prefilled in chunks
LLM_ARGS = {
    "dtype": "float32",
    "max_model_len": 512,
    "max_num_batched_tokens": TOKEN_BUDGET,
    "max_num_seqs": 8,
    "block_size": BLOCK_SIZE,
    "enable_prefix_caching": True,
    "enable_chunked_prefill": True,
    "seed": 0,
}

_WORDS = [w for w in vocabulary() if w.isalpha()]
LONG_PROMPT = " ".join(_WORDS[(7 * i) % len(_WORDS)] for i in range(100))
PREFIX = " ".join(_WORDS[(5 * i + 3) % len(_WORDS)] for i in range(40))
GREEDY_TOKENS = 16
GREEDY_PROMPTS = [
    "the quick brown fox jumps over the lazy dog",
    "one two three",
    LONG_PROMPT,
    PREFIX + " red green blue",
    PREFIX + " one two three four",
    "kunlun",
]
DEMO_TOKENS = 12


def req(prompt: str, max_tokens: int, **sampling: Any) -> dict[str, Any]:
    """A request; greedy unless ``sampling`` says otherwise."""
    sampling = {"temperature": 0.0, **sampling}
    return {"prompt": prompt, "max_tokens": max_tokens, "sampling": sampling}


GREEDY_JOBS = [
    # Puts PREFIX's blocks into the prefix cache before the batch that reuses them.
    {"name": "warm_prefix", "requests": [req(PREFIX + " quick brown fox", 4)]},
    {"name": "greedy", "requests": [req(p, GREEDY_TOKENS) for p in GREEDY_PROMPTS]},
]
SEEDED_LONG = req(LONG_PROMPT, 12, temperature=0.7, top_k=3, top_p=0.8, seed=44)
SEEDED_A = {
    "name": "seeded_a",
    "requests": [
        # First in line: prefilled in chunks of 32, 32, 32, 4 (3 discarded samples).
        SEEDED_LONG,
        req("the quick brown fox", 12, temperature=1.0, seed=11),
        req("one two three", 12, temperature=0.8, top_k=5, seed=22),
        req("each layer has its own key value cache", 12, temperature=1.0),  # no seed
        req("a long river", 12, temperature=1.0, top_p=0.9, seed=33),
        req("the quick brown fox", 12, temperature=1.0, seed=12),
    ],
}
# The same seeded requests with other companions, in another order. Behind a 30-token
# prompt the long one is prefilled as 2, 31, 31, 31, 5 (4 discarded samples): its draws
# must not depend on how its prompt was chunked.
SEEDED_B = {
    "name": "seeded_b",
    "requests": [
        req(" ".join(_WORDS[:30]), 12, temperature=1.0),
        SEEDED_LONG,
        req("night and day", 12, temperature=1.0),
        req("a long river", 12, temperature=1.0, top_p=0.9, seed=33),
        req("the quick brown fox", 12, temperature=1.0, seed=11),
        req("one two three", 12, temperature=0.8, top_k=5, seed=22),
    ],
}


def engine_spec(
    model: str,
    jobs: list[dict[str, Any]],
    *,
    llm: dict[str, Any] | None = None,
    hf_jobs: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The spec ``e2e_runner.py`` reads: vLLM (``backend``) serving ``model`` with the
    engine settings ``llm`` (default ``LLM_ARGS``) runs ``jobs``, guarded against
    ``Tensor.exponential_``; ``hf_jobs``: transformers' reference runs of the same
    checkpoint; ``extra``: the runner's other keys (``hf_cache``, ``hf_also``, ...)."""
    spec: dict[str, Any] = {
        "backend": "vllm",
        "model": model,
        "llm": LLM_ARGS if llm is None else llm,
        "guard_exponential": True,
        "jobs": jobs,
    }
    if hf_jobs is not None:
        spec["hf_jobs"] = hf_jobs
    return {**spec, **extra}


def run_spec(
    spec: dict[str, Any],
    tmp: Path,
    name: str,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> dict:
    """Run e2e_runner.py on ``spec`` in a fresh interpreter (host emulation unless
    ``env`` says otherwise); fail with its error and log tails."""
    spec_path, out_path = tmp / f"{name}.spec.json", tmp / f"{name}.out.json"
    spec_path.write_text(json.dumps(spec))
    for attempt in (1, 2):
        out_path.unlink(missing_ok=True)
        proc = run_bounded(
            [sys.executable, str(RUNNER), str(spec_path), str(out_path)],
            env=child_env(EMULATION if env is None else env),
            timeout=timeout,
        )
        result = json.loads(out_path.read_text()) if out_path.exists() else {}
        failed = proc.returncode != 0 or result.get("error")
        port = port_taken(proc.stdout + proc.stderr + str(result.get("error")))
        if not failed or port is None or attempt == 2:
            break
        # vLLM picks a free port, then binds it seconds later: an engine or a Ray
        # node started by the other xdist worker in between takes it. Not the
        # engine's fault; start it once more.
        warnings.warn(
            f"{name}: port {port} was taken between vLLM's choice and its bind "
            "(EADDRINUSE); starting the engine again",
            stacklevel=2,
        )
    if failed:
        pytest.fail(
            f"{name}: exit {proc.returncode}\n{result.get('error')}\n"
            f"--- stderr tail ---\n{proc.stderr[-4000:]}\n"
            f"--- stdout tail ---\n{proc.stdout[-3000:]}"
        )
    return result


_IN_USE = re.compile(r"EADDRINUSE|[Aa]ddress already in use")
_PORT = re.compile(r"port[\s:=]+(\d+)")


def port_taken(output: str) -> str | None:
    """The port an engine's output says was already in use ("?" when it names none
    near the error), or None when it names no such failure."""
    match = _IN_USE.search(output)
    if match is None:
        return None
    near = _PORT.search(output[max(0, match.start() - 300) : match.end() + 300])
    return near.group(1) if near else "?"


LOG_LINE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR) \d\d-\d\d ", re.M)


def check_demo_text(proc: subprocess.CompletedProcess[str]) -> str:
    """Text mode: stdout is the report alone; vLLM's log is in the file the first line
    names. Returns the log."""
    assert not LOG_LINE.search(proc.stdout), proc.stdout[:3000]
    first = proc.stdout.splitlines()[0]
    match = re.search(r"vLLM's log: (\S+) \(-v shows it here\)", first)
    assert match, first
    log = Path(match.group(1)).read_text()
    assert "Platform plugin kunlun is activated" in log
    return log


def run_demo_cli(
    work: Path,
    env: dict[str, str],
    fakes: bool,
    json_stdout: bool = False,
    model: str | None = None,
) -> tuple[dict, subprocess.CompletedProcess[str]]:
    """``vllm-kunlun demo --json-out`` in a fresh interpreter (its own cache dir under
    ``work``); fail with the log tails unless it succeeds; the report and the process.
    ``json_stdout``: with ``--json``, whose stdout must be that report and nothing
    else; otherwise text mode, whose stdout must be the report without vLLM's log.
    ``model``: ``--model`` (None: the demo's default)."""
    out = work / "demo.json"
    proc = run_bounded(
        [
            sys.executable,
            "-m",
            "vllm_kunlun.cli",
            "demo",
            "--max-tokens",
            str(DEMO_TOKENS),
            "--json-out",
            str(out),
            *(["--json"] if json_stdout else []),
            *(["--model", model] if model else []),
        ],
        env=child_env({"XDG_CACHE_HOME": str(work / "xdg"), **env}, fakes=fakes),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-3000:]
    report = json.loads(out.read_text())
    if json_stdout:
        assert json.loads(proc.stdout) == report, proc.stdout[:3000]
    else:
        check_demo_text(proc)
    return report, proc


def assert_greedy_equal(run: dict, jobs: list[dict]) -> None:
    """Each job's greedy tokens in ``run`` equal its transformers reference
    (``run["hf"]``, from a spec with ``hf_jobs``)."""
    for job in jobs:
        name = job["name"]
        for got, want in zip(run["jobs"][name], run["hf"][name], strict=True):
            assert got["prompt_token_ids"] == want["prompt_token_ids"]
            assert got["token_ids"] == want["token_ids"], (name, got["text"])


def assert_reference_not_degenerate(run: dict, job: str = "greedy") -> None:
    """The transformers reference of ``job`` says different things for different
    prompts, several distinct tokens each: an equality with it then means something."""
    greedy = [tuple(r["token_ids"]) for r in run["hf"][job]]
    assert len(set(greedy)) == len(greedy), greedy
    assert all(len(set(t)) >= 4 for t in greedy), greedy


def moe_paths(run: dict) -> Counter[str]:
    """Calls per MoE kernel path, summed over the ranks' serving reports."""
    paths: Counter[str] = Counter()
    for info in run["serving"]:
        for entry in info["moe_kernels"]:
            paths[entry["path"]] += int(entry["calls"])
    return paths
