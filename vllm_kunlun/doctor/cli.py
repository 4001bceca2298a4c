"""``vllm-kunlun doctor``: run every preflight check and print the findings."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from vllm_kunlun.cli.args import (
    add_json_flag,
    fraction,
    int_range,
    non_negative_float,
    positive_float,
)

# Bounds far above any deployment, low enough that the arithmetic stays exact.
MAX_TP = 1024
MAX_PP = 64
MAX_SEQS = 1 << 20
MAX_GIB = 1 << 20


# vLLM's integer serving flags the budget reads: flag, bounds, default, help.
_COUNTS: tuple[tuple[str, int, int, int, str | None], ...] = (
    ("--tensor-parallel-size", 1, MAX_TP, 1, None),
    (
        "--pipeline-parallel-size",
        1,
        MAX_PP,
        1,
        "pipeline stages (the budget is the busiest stage's, per card)",
    ),
    ("--max-num-seqs", 1, MAX_SEQS, 256, None),
    (
        "--num-speculative-tokens",
        0,
        16,
        0,
        "num_speculative_tokens of --speculative-config (MTP): the budget counts "
        "the extra GDN state blocks, draft KV and sampler rows (default 0: none)",
    ),
    (
        "--max-loras",
        0,
        256,
        0,
        "vLLM's --max-loras when serving with --enable-lora: the budget counts "
        "the LoRA slots beside the weights (default 0: LoRA off)",
    ),
    ("--max-lora-rank", 1, 512, 16, "vLLM's --max-lora-rank (default 16, vLLM's)"),
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="preflight checks: what is wrong and the fix",
        description="Preflight checks for a Kunlun deployment. Exit code 1 when any "
        "check fails. See docs/doctor.md.",
    )
    p.add_argument("--model", help="model directory (or Hub id) the engine will load")
    for flag, low, high, default, text in _COUNTS:
        p.add_argument(flag, type=int_range(low, high), default=default, help=text)
    p.add_argument(
        "--distributed-executor-backend",
        choices=("mp", "ray", "uni", "external_launcher"),
        help="as vLLM's flag; ray (or RAY_ADDRESS set) runs the ray check",
    )
    p.add_argument("--gpu-memory-utilization", type=fraction, default=0.9)
    for flag, state, auto in (
        ("--mamba-cache-dtype", "conv", "the model dtype"),
        (
            "--mamba-ssm-cache-dtype",
            "recurrent",
            "the checkpoint's mamba_ssm_dtype, else the conv state's",
        ),
    ):
        p.add_argument(
            flag,
            choices=("auto", "float32", "bfloat16", "float16"),
            default="auto",
            help=f"as vLLM's flag: dtype of the linear-attention {state} state "
            f"(auto: {auto})",
        )
    p.add_argument(
        "--device-memory-gib",
        type=positive_float(MAX_GIB),
        help="memory of one card, > 0 (default: torch.cuda's, else a P800's 96 GiB)",
    )
    p.add_argument(
        "--reserve-gib",
        type=non_negative_float(MAX_GIB),
        help="runtime reserve beside the KV cache for the budget check, >= 0 "
        "(default 6)",
    )
    p.add_argument(
        "--source",
        help="vllm-kunlun source checkout to compare with the installed package "
        "(default: the checkout at or above the working directory, if any)",
    )
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # vLLM logs to stdout by default; the report (and --json) owns stdout. Only takes
    # effect when vLLM is not imported yet, which is the case for the console script.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    from vllm_kunlun.checks.finding import Context, run_checks
    from vllm_kunlun.doctor.checks import CHECKS
    from vllm_kunlun.doctor.report import exit_code, render_json, render_table

    ctx = Context(
        model=args.model,
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        distributed_executor_backend=args.distributed_executor_backend,
        max_num_seqs=args.max_num_seqs,
        gpu_memory_utilization=args.gpu_memory_utilization,
        mamba_cache_dtype=args.mamba_cache_dtype,
        mamba_ssm_cache_dtype=args.mamba_ssm_cache_dtype,
        num_speculative_tokens=args.num_speculative_tokens,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        device_memory_bytes=(
            None
            if args.device_memory_gib is None
            else int(args.device_memory_gib * (1 << 30))
        ),
        reserve_gib=args.reserve_gib,
        source_root=args.source,
    )
    findings = run_checks(CHECKS, ctx)
    if args.json:
        print(render_json(findings))
    else:
        print(render_table(findings, colour=sys.stdout.isatty()))
    return exit_code(findings)
