"""Check ``environment``: every ``VLLM_KUNLUN_*`` variable that is set parses.

The platforms refuse a malformed value when they start (``envs.validate_all``); the
doctor reports the same refusals as one failed finding, and names variables nothing
declares (a typo that would otherwise be ignored) as a warning.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from vllm_kunlun import envs
from vllm_kunlun.checks.finding import Context, Finding


def check_environment(
    ctx: Context, environ: Mapping[str, str] | None = None
) -> Finding:
    env = os.environ if environ is None else environ
    declared = envs.registry()
    bad = envs.problems(env)
    unknown = envs.unknown(env)
    set_vars = {k: env[k] for k in sorted(env) if k.startswith(envs.PREFIX)}
    details = {
        "set": set_vars,
        "malformed": bad,
        "unknown": unknown,
    }
    if bad:
        return Finding(
            "environment",
            "fail",
            "; ".join(bad.values()),
            "set "
            + ", ".join(f"{name} to {declared[name].accepted}" for name in bad)
            + " (or unset it for its default); the engine refuses to start until then",
            details,
        )
    if unknown:
        hints = [
            f"{n} (did you mean {near}?)" if near else n for n, near in unknown.items()
        ]
        return Finding(
            "environment",
            "warn",
            "not variables of this vllm-kunlun version, ignored: " + ", ".join(hints),
            "rename or unset them; the declared variables are listed in the README's "
            "Configuration table",
            details,
        )
    return Finding(
        "environment",
        "ok",
        f"{len(set_vars)} VLLM_KUNLUN_* variable(s) set, all well-formed",
        details=details,
    )
