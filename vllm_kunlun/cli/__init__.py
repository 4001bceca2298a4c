"""``vllm-kunlun``: the plugin's command line.

Each subcommand lives with the code it drives and exposes ``add_parser(subparsers)``,
which registers the subcommand and sets ``func`` (returns the exit code). The list
below is the whole CLI; importing a subcommand module must stay cheap (no vLLM import
before the command runs).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

SUBCOMMAND_MODULES = (
    "vllm_kunlun.doctor.cli",
    "vllm_kunlun.cli.versions",
    "vllm_kunlun.file_patches.cli",
    "vllm_kunlun.demo.cli",
    "vllm_kunlun.accuracy.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-kunlun", description="vLLM platform plugin for Kunlun P800 XPUs"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "json", False):
        # Every --json prints one JSON document on stdout and nothing else: vLLM's
        # log (stdout by default) and anything the engine processes write go to stderr.
        from vllm_kunlun.cli.streams import json_stdout

        with json_stdout():
            return int(args.func(args))
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
