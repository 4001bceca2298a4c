"""``vllm-kunlun accuracy --url URL --model DIR``: does the deployment at URL compute
what the checkpoint DIR computes? Exit 0 pass, 1 wrong numbers (or another
tokenization), 2 usage, connection or reference error.

Importing this module stays cheap (no torch, no vLLM): the CLI imports every subcommand
module to build its parser.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from vllm_kunlun.cli.args import add_json_flag, positive_float

PROMPTS = (
    "the quick brown fox jumps over the lazy dog",
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1)",
    "1, 2, 3, 5, 8, 13, 21, 34, 55, 89",
    "each layer has its own key value cache, and the cache grows with the context",
    "Water boils at one hundred degrees Celsius at sea level.",
)
"""Prose, code and numbers: different parts of the vocabulary and of the attention."""
DTYPES = ("auto", "float32", "bfloat16", "float16")
# A prompts file is a handful of prompts; a larger one (or /dev/zero) is a wrong path.
MAX_PROMPTS_BYTES = 1 << 20


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "accuracy",
        help="compare a live vLLM server's prompt logprobs with transformers on the CPU",
        description="Asks the OpenAI-compatible server at --url for teacher-forced "
        "prompt logprobs of a few prompts, computes the same with transformers from "
        "--model (the served checkpoint directory) on the CPU, and judges top-1 "
        "agreement and logprob gaps by the served precision's thresholds "
        "(docs/accuracy.md); the served dtype and quantization are asked from the "
        "server, and one that serves another quantization than --model's fails. "
        "Exit 0 pass, 1 wrong deployment, 2 usage or "
        "connection error.",
    )
    p.add_argument(
        "--url",
        required=True,
        type=server_url,
        help="the server, e.g. http://127.0.0.1:8000",
    )
    p.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="the local checkpoint directory the server was started on",
    )
    p.add_argument(
        "--prompts",
        metavar="FILE",
        help="prompts instead of the built-in ones: a JSON list of strings, or one "
        "prompt per line",
    )
    p.add_argument(
        "--served-model",
        metavar="NAME",
        help="the model name to ask for (default: the one /v1/models lists)",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="the dtype the server computes in, as given to vllm serve --dtype; "
        "chooses the thresholds (default auto: what the server reports, else the "
        "checkpoint's config.json dtype)",
    )
    p.add_argument(
        "--timeout",
        type=positive_float(24 * 3600.0),
        default=300.0,
        help="seconds per HTTP request (default 300)",
    )
    add_json_flag(p)
    p.set_defaults(func=run_accuracy_command)


class UsageError(ValueError):
    pass


def server_url(text: str) -> str:
    """An http(s) URL with a host: argparse answers anything else with exit 2."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text.strip())
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http(s) URL with a host; give the server's address, "
            "e.g. http://127.0.0.1:8000"
        )
    return text.strip()


def read_prompts(path: str | None) -> list[str]:
    """The built-in prompts, or FILE's: a JSON list of strings, else one per line.
    At most ``MAX_PROMPTS_BYTES`` are read (``/dev/zero`` never ends)."""
    if path is None:
        return list(PROMPTS)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_PROMPTS_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"--prompts {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_PROMPTS_BYTES:
        raise UsageError(
            f"--prompts {path}: larger than {MAX_PROMPTS_BYTES >> 20} MiB; give a file "
            "of a few prompts"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"--prompts {path}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
            "give a JSON list of strings or one prompt per line"
        ) from None
    prompts: Any
    if text.lstrip().startswith("["):
        try:
            prompts = json.loads(text)
        except RecursionError:
            raise UsageError(
                f"--prompts {path}: JSON nested too deeply; give a flat list of strings"
            ) from None
        except ValueError as exc:
            raise UsageError(f"--prompts {path}: not valid JSON ({exc})") from None
        if not isinstance(prompts, list) or not all(
            isinstance(p, str) for p in prompts
        ):
            raise UsageError(f"--prompts {path}: the JSON must be a list of strings")
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        raise UsageError(f"--prompts {path}: no prompt in the file")
    return prompts


def _fail(args: argparse.Namespace, code: int, message: str) -> int:
    if args.json:
        print(json.dumps({"passed": False, "exit_code": code, "error": message}))
    else:
        print(f"vllm-kunlun accuracy: {message}", file=sys.stderr)
    return code


def _on_terminal(args: argparse.Namespace) -> bool:
    """Progress goes to stderr on a terminal only, never under --json."""
    return not args.json and sys.stderr.isatty()


def _progress(args: argparse.Namespace, message: str) -> None:
    if _on_terminal(args):
        print(message, file=sys.stderr, flush=True)


def run_accuracy_command(args: argparse.Namespace) -> int:
    from vllm_kunlun.accuracy import compare, endpoint, reference

    try:
        prompts = read_prompts(args.prompts)
        ckpt = reference.inspect_checkpoint(args.model)
    except (UsageError, reference.ReferenceUnavailable) as exc:
        return _fail(args, 2, str(exc))

    # The server first: a wrong --url is found before minutes of loading.
    try:
        name = args.served_model
        if name is None:
            names = endpoint.served_models(args.url, args.timeout)
            if len(names) != 1:
                return _fail(
                    args,
                    2,
                    f"{args.url} serves {names or 'no model'}; choose one with "
                    "--served-model",
                )
            name = names[0]
        config = endpoint.served_config(args.url, name, args.timeout)
        # Judge by what the server computes with, when it says.
        dtype, quant = compare.served_precision(
            config, ckpt.quant, ckpt.dtype, args.dtype, args.model, name
        )
        precision, th = compare.thresholds_for(dtype, quant)
        served = []
        for i, prompt in enumerate(prompts, 1):
            _progress(args, f"server: prompt {i}/{len(prompts)}")
            answer = endpoint.prompt_logprobs(args.url, name, prompt, args.timeout)
            if not answer.positions:
                return _fail(
                    args, 2, f"prompt {prompt!r} is one token: give at least two"
                )
            served.append(answer)
    except (endpoint.EndpointError, compare.DtypeConflict) as exc:
        return _fail(args, 2, str(exc))
    except compare.ServedMismatch as exc:
        return _fail(args, 1, str(exc))

    longest = max(len(s.token_ids) for s in served)
    try:
        plan = reference.plan_memory(ckpt, longest, reference.available_memory())
        _progress(
            args,
            f"reference: loading {args.model} in {plan.dtype} on the CPU "
            f"(about {plan.estimate_bytes / reference.GIB:.1f} GiB of "
            f"{plan.available_bytes / reference.GIB:.1f} GiB available)",
        )
        ref = reference.Reference(args.model, plan.dtype, _on_terminal(args))
    except reference.ReferenceUnavailable as exc:
        return _fail(args, 2, str(exc))

    results = []
    try:
        for i, (prompt, s) in enumerate(zip(prompts, served, strict=True), 1):
            ids = ref.tokenize(prompt)
            compare.check_tokens(prompt, s.token_ids, ids)
            _progress(
                args,
                f"reference forward: prompt {i}/{len(prompts)} ({len(ids)} tokens)",
            )
            top1 = [p.top1_id for p in s.positions]
            results.append(
                compare.compare_prompt(prompt, s, ids, ref.forward(ids, top1))
            )
    except compare.TokenizationMismatch as exc:
        return _fail(args, 1, str(exc))

    verdict = compare.judge(results, precision, th)
    doc = compare.report(
        verdict,
        results,
        url=args.url,
        model=args.model,
        served_model=name,
        served_dtype=dtype,
        quantization=quant,
        served_config={
            "source": config.source,
            "model": config.model,
            "dtype": config.dtype,
            "quantization": config.quantization,
        },
        reference_dtype=plan.dtype,
    )
    if args.json:
        print(json.dumps(doc))
    else:
        print_text(doc, ref)
    return 0 if verdict.passed else 1


def print_text(doc: dict[str, Any], ref: Any) -> None:
    print(
        f"{doc['served_model']} at {doc['url']} against transformers "
        f"({doc['reference_dtype']}, CPU), thresholds for {doc['precision']}"
    )
    print(f"{'agree':>7} {'max gap':>9} {'mean gap':>9}  prompt")
    for r in doc["prompts"]:
        text = r["prompt"].replace("\n", "\\n")
        text = text if len(text) <= 48 else text[:45] + "..."
        print(f"{r['agreement']:7.3f} {r['max_gap']:9.2e} {r['mean_gap']:9.2e}  {text}")
    th = doc["thresholds"]
    print(
        f"all positions: agreement {doc['agreement']:.4f} (>= {th['min_agreement']}), "
        f"largest gap {doc['max_gap']:.3g} (<= {th['max_gap']:g}), mean gap "
        f"{doc['mean_gap']:.3g} (<= {th['max_mean_gap']:g})"
    )
    worst = max(doc["prompts"], key=lambda r: float(r["max_gap"]))
    print(
        f"worst: {worst['prompt'][:48]!r} position {worst['worst_position']} "
        f"(token {ref.decode(worst['worst_token'])!r}): server "
        f"{worst['server_logprob']:.4f}, reference {worst['reference_logprob']:.4f}"
    )
    if doc["passed"]:
        print("PASS: the deployment computes the checkpoint's numbers")
    else:
        for f in doc["failures"]:
            print(f"FAIL: {f}")
