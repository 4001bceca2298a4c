"""``vllm-kunlun patch status|apply|revert|verify``: the file patch set from the shell.

Exit codes: 0 done (or nothing to do); 1 drift or leftover temp files found (status)
or the set is not fully applied and verified (verify); 2 refused or failed with every
file as before (wrong vLLM / torch pair, drift, unwritable or unreadable file, a
malformed patch set, lock busy, a write that was rolled back); 3 a write failed and
restoring failed too (the message names the files and the fix). Bad arguments exit 2
(argparse).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from vllm_kunlun.cli.args import add_json_flag, non_negative_float

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
    add_json_flag(common)
    common.add_argument(
        "--dry-run",
        action="store_true",
        help="check everything and say what would change; write nothing",
    )
    common.add_argument(
        "--lock-timeout",
        type=non_negative_float(),
        default=60.0,
        help="seconds to wait for another patch run on the same vLLM (default 60)",
    )
    p = sub.add_parser(
        "patch", help="the patch_torch251 file patch set for vLLM 0.15.1 on torch 2.5.1"
    )
    actions = p.add_subparsers(dest="patch_action", required=True)
    for name, text in (
        (
            "status",
            "per patch: applied, not applied or drifted (exit 1 on drift or leftover temp files)",
        ),
        (
            "apply",
            "apply the whole set (rolled back on an error); a second apply is a no-op",
        ),
        ("revert", "restore the exact pre-patch files"),
        ("verify", "exit 0 only if every patch is applied and revert would work"),
    ):
        actions.add_parser(name, parents=[common], help=text, description=text)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vllm_kunlun.file_patches import engine
    from vllm_kunlun.file_patches.errors import PatchError, RollbackFailed

    kwargs = {"root": args.root, "patch_dir": args.patches}
    try:
        if args.patch_action == "status":
            report = engine.status(**kwargs, lock_timeout=args.lock_timeout)
            from vllm_kunlun.patching import registry

            runtime = registry.describe()
            # the runtime patches go above the summary line, which stays last
            body, _, summary = _render_status(report, args).rpartition("\n")
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
            return EXIT_DRIFT if report.drifted or report.leftovers else EXIT_OK
        if args.patch_action == "verify":
            report, problems = engine.verify(**kwargs, lock_timeout=args.lock_timeout)
            payload = {
                **report.to_json(),
                "verified": not problems,
                "problems": problems,
            }
            text = _render_status(report, args)
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
            f"  {'would remove' if outcome.dry_run else 'removed'} leftover temp "
            f"file {p}"
            for p in outcome.removed
        ]
        lines += [
            f"  {'would change' if outcome.dry_run else 'changed'} {t}"
            for t in outcome.changed
        ]
        if not outcome.dry_run and outcome.changed:
            lines.append(outcome.report.summary_line())
        _emit(args, outcome.to_json(), "\n".join(lines))
        return EXIT_OK
    except PatchError as exc:
        _emit_error(args, exc.to_json(), str(exc))
        return EXIT_INCONSISTENT if isinstance(exc, RollbackFailed) else EXIT_REFUSED
    except OSError as exc:
        # Whatever the checks did not foresee on a hostile tree: a refusal with the
        # file named, never a traceback (which would exit 1, the drift code).
        error = {
            "type": type(exc).__name__,
            "file": str(exc.filename or ""),
            "reason": exc.strerror or str(exc),
            "fix": "fix the file named above (or pass --root / --patches another "
            "tree) and rerun",
        }
        _emit_error(
            args, error, f"{error['file']}: {error['reason']}. Fix: {error['fix']}"
        )
        return EXIT_REFUSED


def _emit_error(args: argparse.Namespace, error: dict[str, str], text: str) -> None:
    if args.json:
        print(json.dumps({"error": error}, indent=2))
    else:
        print(f"vllm-kunlun patch {args.patch_action}: {text}", file=sys.stderr)


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


def _render_status(report: Any, args: argparse.Namespace) -> str:
    from vllm_kunlun.file_patches.engine import patch_command
    from vllm_kunlun.versions import reinstall_vllm

    apply_cmd = patch_command("apply", args.root, args.patches)
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
    if report.leftovers:
        lines.append("  leftover temp files of an interrupted apply / revert:")
        lines += [f"      {p}" for p in report.leftovers]
    summary = report.summary_line()
    if report.drifted:
        where = (
            f" (with the pip of the environment that holds {args.root})"
            if args.root is not None
            else ""
        )
        summary += f". Fix: {reinstall_vllm(ps.vllm_version)}{where}, then {apply_cmd}"
    elif report.pair_problem is None and (
        report.applied < report.total or report.leftovers
    ):
        summary += f". Fix: {apply_cmd}"
    lines.append(summary)
    return "\n".join(lines)
