"""``vllm-kunlun patch status|apply|revert|verify``: the file patch set from the shell.

Exit codes: 0 done (or nothing to do); 1 drift found (status) or the set is not fully
applied and verified (verify); 2 refused or failed with every file as before (wrong
vLLM / torch pair, drift, unwritable file, lock busy, a write that was rolled back);
3 a write failed and restoring failed too (the message names the files and the fix).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EXIT_OK, EXIT_DRIFT, EXIT_REFUSED, EXIT_INCONSISTENT = 0, 1, 2, 3


def add_parser(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--root",
        help="directory containing the vllm package (default: the vLLM that "
        "`import vllm` finds)",
    )
    common.add_argument(
        "--patches",
        help="patch set directory (default: VLLM_KUNLUN_PATCH_DIR or the "
        "source checkout's patches/vllm-0.15.1-torch-2.5.1)",
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument(
        "--dry-run",
        action="store_true",
        help="check everything and say what would change; write nothing",
    )
    common.add_argument(
        "--lock-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for another patch run on the same vLLM (default 60)",
    )
    p = sub.add_parser(
        "patch", help="the patch_torch251 file patch set for vLLM 0.15.1 on torch 2.5.1"
    )
    actions = p.add_subparsers(dest="patch_action", required=True)
    for name, text in (
        ("status", "per patch: applied, not applied or drifted (exit 1 on drift)"),
        ("apply", "apply the whole set or nothing; a second apply is a no-op"),
        ("revert", "restore the exact pre-patch files"),
        ("verify", "exit 0 only if every patch is applied and revert would work"),
    ):
        actions.add_parser(name, parents=[common], help=text, description=text)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vllm_kunlun.patching import engine
    from vllm_kunlun.patching.errors import PatchError, RollbackFailed

    kwargs = {"root": args.root, "patch_dir": args.patches}
    try:
        if args.patch_action == "status":
            report = engine.status(**kwargs, lock_timeout=args.lock_timeout)
            from vllm_kunlun.patching import registry

            runtime = registry.describe()
            # the runtime patches go above the summary line, which stays last
            body, _, summary = _render_status(report).rpartition("\n")
            _emit(
                args,
                {
                    **report.to_json(),
                    "runtime_fixes": registry.torch_fix_states(),
                    "runtime_patches": runtime,
                },
                body + _render_runtime_patches(runtime) + "\n" + summary,
            )
            if report.pair_problem is not None:
                return EXIT_REFUSED
            return EXIT_DRIFT if report.drifted else EXIT_OK
        if args.patch_action == "verify":
            report, problems = engine.verify(**kwargs, lock_timeout=args.lock_timeout)
            payload = {
                **report.to_json(),
                "verified": not problems,
                "problems": problems,
            }
            text = _render_status(report)
            text += "\n" + (
                "verified: every patch applied, revert reproduces the pristine files"
                if not problems
                else "NOT verified:\n" + "\n".join(f"  - {p}" for p in problems)
            )
            _emit(args, payload, text)
            return EXIT_OK if not problems else EXIT_DRIFT
        change = engine.apply if args.patch_action == "apply" else engine.revert
        outcome = change(**kwargs, dry_run=args.dry_run, lock_timeout=args.lock_timeout)
        lines = [outcome.message]
        lines += [
            f"  {'would change' if outcome.dry_run else 'changed'} {t}"
            for t in outcome.changed
        ]
        if not outcome.dry_run and outcome.changed:
            lines.append(outcome.report.summary_line())
        _emit(args, outcome.to_json(), "\n".join(lines))
        return EXIT_OK
    except PatchError as exc:
        if args.json:
            print(json.dumps({"error": exc.to_json()}, indent=2))
        else:
            print(f"vllm-kunlun patch {args.patch_action}: {exc}", file=sys.stderr)
        return EXIT_INCONSISTENT if isinstance(exc, RollbackFailed) else EXIT_REFUSED


def _render_runtime_patches(patches: list[dict[str, Any]]) -> str:
    """Name and state, then what it replaces and why (vllm_kunlun/patching/registry.py)."""
    width = max(len(p["name"]) for p in patches)
    lines = ["runtime patches (no file changes; applied in the processes named):"]
    for p in patches:
        lines.append(f"  {p['name']:<{width}}  {p['state']}")
        lines.append(f"      {', '.join(p['targets'])}: {p['why']}")
    return "\n" + "\n".join(lines)


def _emit(args: argparse.Namespace, payload: dict[str, Any], text: str) -> None:
    print(json.dumps(payload, indent=2) if args.json else text)


def _render_status(report: Any) -> str:
    ps = report.patch_set
    lines = [
        f"patch set {ps.name} (vLLM {ps.vllm_version} + torch {ps.torch_version}) "
        f"from {ps.directory}",
        f"vLLM {report.vllm_version} at {report.root / 'vllm'}, "
        f"torch {report.torch_version}",
    ]
    if report.pair_problem is not None:
        lines.append(f"REFUSED: {report.pair_problem}")
    id_width = max(len(p.id) for p in report.patches)
    target_width = max(len(p.target) for p in report.patches)
    for p in report.patches:
        state = p.state.upper() if p.state == "drifted" else p.state
        lines.append(f"  {p.id:<{id_width}}  {p.target:<{target_width}}  {state}")
        if p.detail:
            lines.append(f"      {p.detail}")
    summary = report.summary_line()
    if report.drifted:
        summary += (
            f". Fix: pip install --no-deps --force-reinstall vllm=={ps.vllm_version}, "
            "then vllm-kunlun patch apply"
        )
    elif report.applied < report.total and report.pair_problem is None:
        summary += ". Fix: vllm-kunlun patch apply"
    lines.append(summary)
    return "\n".join(lines)
