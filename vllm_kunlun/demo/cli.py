"""``vllm-kunlun demo`` and ``vllm-kunlun tiny-model DIR``.

Importing this module stays cheap (no torch, no vLLM): the CLI imports every subcommand
module to build its parser.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vllm_kunlun.cli.args import int_range, non_negative_float
from vllm_kunlun.cli.streams import output_to_file


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="start vLLM's engine through the plugin and generate (tiny local model)",
        description="Builds the tiny model (default: the deployment log's W8A8 "
        "Qwen3.5 composite in miniature) into the cache directory (no "
        "download), starts vLLM's engine through the plugin (KunlunPlatform on a "
        "Kunlun host, host emulation elsewhere), generates, and reports tokens/s and "
        "what served the requests.",
    )
    p.add_argument(
        "--model",
        help="qwen3_5 (default): the deployment log's model in miniature, a tiny "
        "Qwen3.5 composite, hybrid, W8A8-INT8; qwen3: a tiny dense Qwen3; anything "
        "else: a local model directory (./qwen3 for a directory of that name)",
    )
    p.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    p.add_argument("--max-tokens", type=int_range(1, 1 << 20), default=32)
    p.add_argument("--temperature", type=non_negative_float(1e4), default=0.0)
    p.add_argument("--seed", type=int_range(0, (1 << 63) - 1), default=0)
    p.add_argument(
        "--max-model-len",
        type=int_range(1, 1 << 24),
        default=512,
        help="the engine's context length (default 512, plenty for the tiny model; "
        "lower it for a --model whose KV cache would not fit)",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run the engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the report as JSON, nothing else on stdout (vLLM's log goes to "
        "stderr)",
    )
    p.add_argument(
        "--json-out", metavar="FILE", help="also write the report as JSON to FILE"
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show vLLM's log as it runs (default: written to --log-file)",
    )
    p.add_argument(
        "--log-file",
        metavar="FILE",
        help="where text mode writes vLLM's log (default: demo.log in the cache "
        "directory, $XDG_CACHE_HOME/vllm-kunlun; appended)",
    )
    p.set_defaults(func=run_demo_command)

    t = sub.add_parser(
        "tiny-model",
        help="write a deterministic tiny checkpoint (Qwen3, Qwen3.5 hybrid or "
        "Qwen3.5-MoE) and tokenizer",
    )
    t.add_argument(
        "directory",
        help="where to write it: a new or empty directory (created if needed), or "
        "one tiny-model wrote before (refreshed)",
    )
    t.add_argument(
        "--arch",
        choices=("qwen3", "qwen3_5", "qwen3_5_moe"),
        default="qwen3",
        help="qwen3: dense Qwen3 (default); qwen3_5: Qwen3.5 hybrid (Gated DeltaNet + "
        "full attention); qwen3_5_moe: the hybrid with a routed MoE (8 experts, top-2, "
        "a shared expert) in every layer",
    )
    t.add_argument(
        "--layout",
        choices=("causal", "composite"),
        default="causal",
        help="qwen3_5 and qwen3_5_moe only: the causal LM, or the vision-language "
        "composite (nested text_config, vision and MTP weights)",
    )
    t.add_argument(
        "--quant",
        choices=("w8a8",),
        help="w8a8: a compressed-tensors W8A8-INT8 checkpoint (int8 weights, dynamic "
        "per-token int8 activations; lm_head, and for qwen3_5 the vision tower and "
        "the MTP head, for qwen3_5_moe also the routers, stay float)",
    )
    t.add_argument(
        "--mtp",
        action="store_true",
        help="qwen3_5 only: the composite with a complete multi-token-prediction head, "
        "model and head trained for seconds on the CPU on a small synthetic language "
        "(so MTP speculative decoding accepts drafts)",
    )
    t.add_argument(
        "--tokenizer",
        choices=("words", "bpe"),
        default="words",
        help="words: the word-level tokenizer (default); bpe: a byte-level BPE that "
        "spells any text (JSON, tool calls, <think>) with a Qwen3-style chat template "
        "(structured output, tools, reasoning); not with --quant or --mtp",
    )
    t.set_defaults(func=run_tiny_model_command)


def run_tiny_model_command(args: argparse.Namespace) -> int:
    quant = getattr(args, "quant", None)
    if args.arch == "qwen3" and args.layout != "causal":
        return _tiny_model_refused(
            "--layout applies to --arch qwen3_5 and qwen3_5_moe only"
        )

    mtp = bool(getattr(args, "mtp", False))
    if mtp and args.arch != "qwen3_5":
        return _tiny_model_refused("--mtp applies to --arch qwen3_5 (the composite)")

    bpe = getattr(args, "tokenizer", "words") == "bpe"
    if bpe and (quant or mtp):
        return _tiny_model_refused(
            "--tokenizer bpe does not combine with --quant or --mtp"
        )

    from vllm_kunlun.demo.tiny_model import OutputDirError, checksum, prepare_output_dir

    try:
        # Checked before torch is imported: a refusal is immediate.
        prepare_output_dir(args.directory)
    except OutputDirError as exc:
        return _tiny_model_refused(str(exc))
    if mtp:
        from vllm_kunlun.demo.tiny_model import write_tiny_model
        from vllm_kunlun.demo.tiny_qwen3_5_mtp import TinyQwen3_5MtpSpec

        mtp_spec = TinyQwen3_5MtpSpec()
        what = (
            f"tiny Qwen3.5 hybrid ({mtp_spec.architecture}) with a trained MTP head "
            f"({mtp_spec.train_steps} training steps)"
        )
        if quant == "w8a8":
            from vllm_kunlun.demo.tiny_quant import write_tiny_w8a8

            out = write_tiny_w8a8(args.directory, mtp_spec)
            what += (
                " W8A8-INT8 (text linears and the MTP head int8; vision, lm_head float)"
            )
        else:
            out = write_tiny_model(args.directory, mtp_spec)
    elif args.arch in ("qwen3_5", "qwen3_5_moe"):
        from vllm_kunlun.demo.tiny_model import write_tiny_model
        from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec
        from vllm_kunlun.demo.tiny_qwen3_5_moe import TinyQwen3_5MoeSpec

        moe = args.arch == "qwen3_5_moe"
        spec = (TinyQwen3_5MoeSpec if moe else TinyQwen3_5Spec)(layout=args.layout)
        kind = "Qwen3.5-MoE hybrid" if moe else "Qwen3.5 hybrid"
        what = f"tiny {kind} ({spec.architecture})"
        if quant == "w8a8":
            from vllm_kunlun.demo.tiny_quant import write_tiny_w8a8

            out = write_tiny_w8a8(args.directory, spec)
            floats = "vision tower, MTP head, " + ("routers, " if moe else "")
            what += f" W8A8-INT8 (compressed-tensors, dynamic; {floats}lm_head float)"
        else:
            out = write_tiny_model(args.directory, _with_tokenizer(spec, bpe))
    elif quant == "w8a8":
        from vllm_kunlun.demo.tiny_quant import write_tiny_w8a8

        out = write_tiny_w8a8(args.directory)
        what = "tiny Qwen3 W8A8-INT8 (compressed-tensors, dynamic)"
    else:
        from vllm_kunlun.demo.tiny_model import TinyQwen3Spec, write_tiny_model

        out = write_tiny_model(args.directory, _with_tokenizer(TinyQwen3Spec(), bpe))
        what = "tiny Qwen3"
    if bpe:
        what += " with the byte-level BPE tokenizer"
    print(f"{what} written to {out} (sha256 {checksum(out)[:16]})")
    return 0


def _with_tokenizer(spec: Any, bpe: bool) -> Any:
    """``spec`` as is, or with the byte-level BPE tokenizer (``--tokenizer bpe``)."""
    if not bpe:
        return spec
    from vllm_kunlun.demo.tiny_bpe import BpeTokenizerSpec

    return BpeTokenizerSpec(spec)


def _tiny_model_refused(why: str) -> int:
    print(f"vllm-kunlun tiny-model: {why}", file=sys.stderr)
    return 2


def gdn_lines(served: list[dict[str, str]]) -> list[str]:
    """One line per kernel path and device: the ops it served, then why."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for c in served:
        groups.setdefault((c["path"], c["device"], c["reason"]), []).append(c["op"])
    return [
        f"{path} on {device}: {', '.join(ops)} ({why})"
        for (path, device, why), ops in groups.items()
    ]


def moe_lines(
    served: list[dict[str, Any]], experts: dict[str, Any] | None
) -> list[str]:
    """One line per MoE path and device: its calls and why, with how this rank holds
    the experts."""
    held = ""
    if experts:
        last = experts["expert_start"] + experts["local_experts"] - 1
        held = (
            f"experts {experts['expert_start']}..{last} of {experts['num_experts']}, "
            f"width {experts['intermediate']}"
            + (", int8" if experts["quantized"] else "")
            + "; "
        )
    return [
        f"{c['path']} on {c['device']}: {held}{c['calls']} calls ({c['reason']})"
        for c in served
    ]


def _print_report(report: Any) -> None:
    mode = "HOST EMULATION" if report.emulation else "Kunlun"
    print(f"platform choice : {mode}: {report.platform_choice}")
    print(f"model           : {report.model}")
    print(f"                  ({report.model_kind})")
    print(
        f"engine          : {report.engine_mode}, started in "
        f"{report.engine_start_s:.2f} s (import vllm {report.import_s:.1f} s)"
    )
    for info in report.serving:
        # What served each kind of layer, in the order a token meets them.
        print(f"platform        : {info.get('platform')} ({info.get('device_name')})")
        print(f"attention       : {', '.join(info.get('attention_backends') or [])}")
        for line in gdn_lines(info.get("gdn_kernels") or []):
            print(f"GDN kernels     : {line}")
        if info.get("gdn_state_dtypes"):
            conv, recurrent = info["gdn_state_dtypes"]
            print(f"GDN state       : conv {conv}, recurrent {recurrent}")
        if info.get("linear_kernels"):
            print(f"linear kernels  : {', '.join(info['linear_kernels'])}")
        if info.get("int8_kernels"):
            print(f"int8 kernels    : {info['int8_kernels']}")
        for line in moe_lines(info.get("moe_kernels") or [], info.get("moe_experts")):
            print(f"MoE kernels     : {line}")
        for op, st in sorted((info.get("vendor_kernels") or {}).items()):
            served = f"{st['vendor_calls']} vendor calls ({', '.join(st['kernels'])})"
            if st["native_calls"]:
                served += f", {st['native_calls']} native: "
                served += "; ".join(st["native_reasons"])
            print(f"kernels         : {op} x{st['modules']} modules: {served}")
        print(f"sampler         : {info.get('topk_topp_forward')}")
        if info.get("sampling_kernels"):
            print(f"sampling kernels: {info['sampling_kernels']}")
    print()
    for g in report.generations:
        print(f"> {g.prompt}")
        print(f"  {g.text.strip()}")
    if report.image_generation is not None:
        print(f"image> {report.image_generation.prompt}")
        print(f"  {report.image_generation.text.strip()}")
    print()
    print(
        f"{report.output_tokens} tokens for {len(report.generations)} prompts in "
        f"{report.generate_s:.2f} s: {report.output_tokens_per_s:.1f} output tokens/s"
    )
    if report.emulation:
        print("(host emulation: the CPU did the work; this is no Kunlun measurement)")


def default_log_file() -> Path:
    """``demo.log`` beside the tiny model's cache directory."""
    from vllm_kunlun.demo.tiny_model import default_cache_dir

    return default_cache_dir().parent / "demo.log"


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(True)[-lines:])
    except OSError as exc:
        return f"(cannot read {path}: {exc})\n"


def engine_died(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is vLLM's ``EngineDeadError``: the engine
    core process died. Never imports vLLM (an error raised before vLLM was imported is
    not an engine death)."""
    exceptions = sys.modules.get("vllm.v1.engine.exceptions")
    dead = getattr(exceptions, "EngineDeadError", None)
    seen: set[int] = set()
    while dead is not None and exc is not None and id(exc) not in seen:
        if isinstance(exc, dead):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def engine_death_message(log_file: Path | None) -> str:
    """The one line a demo whose engine core died ends with: the death, its usual
    cause and what to do."""
    where = (
        f"vLLM's log ({log_file}) names the process"
        if log_file is not None
        else "vLLM's log above names the process"
    )
    return (
        "vllm-kunlun demo: vLLM's engine core process died (EngineDeadError); "
        f"{where}. The usual cause is the out-of-memory killer (see `dmesg`): free "
        "host memory or lower --max-model-len, then run the demo again."
    )


def _engine_death_ends_the_demo(args: argparse.Namespace, log_file: Path | None) -> int:
    message = engine_death_message(log_file)
    print(message, file=sys.stderr, flush=True)
    error = {"exit_code": 1, "error": message, "cause": "engine core died"}
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(error, f, indent=2)
    if args.json:
        print(json.dumps(error, indent=2), flush=True)
    return 1


@contextlib.contextmanager
def _warnings_to_terminal(logger_name: str) -> Iterator[None]:
    """Warnings of ``logger_name`` reach this terminal's stderr while the block sends
    the process's output to a log file (they reach the file too)."""
    fd = _fileno(sys.stderr)
    stream = sys.stderr if fd is None else open(os.dup(fd), "w", encoding="utf-8")  # noqa: SIM115
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.WARNING)
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.flush()
        if stream is not sys.stderr:
            stream.close()


def _fileno(stream: Any) -> int | None:
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError):  # pytest's capsys, StringIO
        return None


# The logger of tiny_model.ensure_complete, whose "rebuilding it" warning the user must
# see (vllm_kunlun.logger names the plugin's loggers under vLLM's).
REBUILD_LOGGER = "vllm.vllm_kunlun.demo.tiny_model"


def run_demo_command(args: argparse.Namespace) -> int:
    from vllm_kunlun.demo.run import DEFAULT_PROMPTS, choose_platform, run_demo

    choice = choose_platform()

    def demo() -> Any:
        return run_demo(
            model=args.model,
            prompts=tuple(args.prompt) if args.prompt else DEFAULT_PROMPTS,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            seed=args.seed,
            in_process=args.in_process,
            max_model_len=args.max_model_len,
        )

    mode = "host emulation" if choice.emulation else "KunlunPlatform"
    log_file: Path | None = None
    try:
        if args.json:
            # The CLI already sends everything but the report to stderr.
            report = demo()
        elif args.verbose:
            print(f"vllm-kunlun demo: starting vLLM's engine ({mode})...", flush=True)
            report = demo()
        else:
            log_file = Path(args.log_file) if args.log_file else default_log_file()
            log_file.parent.mkdir(parents=True, exist_ok=True)
            print(
                f"vllm-kunlun demo: starting vLLM's engine ({mode}); vLLM's log: "
                f"{log_file} (-v shows it here)",
                flush=True,
            )
            try:
                with (
                    _warnings_to_terminal(REBUILD_LOGGER),
                    output_to_file(str(log_file)) as log,
                ):
                    log.write(f"\n=== vllm-kunlun demo, pid {os.getpid()} ===\n")
                    report = demo()
            except BaseException as exc:
                if not engine_died(exc):
                    print(
                        f"vllm-kunlun demo failed; the end of vLLM's log ({log_file}):\n"
                        + _log_tail(log_file),
                        file=sys.stderr,
                        flush=True,
                    )
                raise
    except Exception as exc:
        if not engine_died(exc):
            raise
        return _engine_death_ends_the_demo(args, log_file)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        _print_report(report)
    return 0
