"""Check ``plugins``: ``VLLM_PLUGINS`` lets vLLM load both of vllm-kunlun's entry points.

Why: when ``VLLM_PLUGINS`` is set, vLLM loads only the plugins it names (the value split
on commas, names compared exactly, no trimming), in every group. Leaving out the
platform plugin (``vllm.platform_plugins``) means vLLM never picks the Kunlun platform
(or host emulation): a failure. Leaving out the general plugin
(``vllm.general_plugins``) means the front-end processes run without the engine-start
guards (a missing local model path, out-of-range prompt token ids): a warning. The
workers are not affected: the plugin's worker applies the runtime fixes itself. The
entry point names are read from the installed metadata, so the check follows setup.py.

On torch < 2.6 leaving out the platform plugin also breaks ``import vllm.config`` (so
``from vllm import LLM`` and ``vllm serve``) unless the file patch set is applied: the
schema fix ``schema_pep585`` runs in the platform plugin's ``register()``, which vLLM
calls when it resolves its platform, right before its first custom op; the general
plugin loads only later, from ``EngineArgs``, after ``vllm.config`` is imported. vLLM
then dies with a bare ``infer_schema ... unsupported type list[int]``; this check names
that cause.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points

from vllm_kunlun.checks.finding import Context, Finding

PLATFORM_GROUP = "vllm.platform_plugins"
GENERAL_GROUP = "vllm.general_plugins"

_CONSEQUENCE = {
    PLATFORM_GROUP: "vLLM never picks the Kunlun platform (nor host emulation)",
    GENERAL_GROUP: "the front end runs without the engine-start guards (missing "
    "model path, out-of-range token ids); the workers still sample on the device",
}


def our_entry_points() -> dict[str, str]:
    """Entry point name -> group, for vllm-kunlun's vLLM plugins as installed."""
    found: dict[str, str] = {}
    for group in (PLATFORM_GROUP, GENERAL_GROUP):
        for ep in entry_points(group=group):
            if ep.value.split(":")[0].split(".")[0] == "vllm_kunlun":
                found[ep.name] = group
    return found


def schema_gap() -> str | None:
    """Why ``import vllm.config`` needs the platform plugin here, or None when not.

    Needed on torch < 2.6 while the patch set is not fully applied (with all of it
    applied, ``from vllm import LLM`` imports without the schema fix).
    """
    from vllm_kunlun.patching import schema

    if not schema.needed():
        return None
    from vllm_kunlun.file_patches import engine
    from vllm_kunlun.file_patches.errors import PatchError

    try:
        applied, total, _ = engine.status_summary()
    except (PatchError, OSError):
        applied, total = 0, 1  # the set cannot apply here: nothing stands in for it
    if applied == total:
        return None
    torch_version = engine.installed_torch_version()
    return (
        f"on torch {torch_version} `import vllm.config` (so `from vllm import LLM`, "
        "`vllm serve`) then dies in torch's infer_schema with \"unsupported type "
        f"list[int]\": the schema fix {schema.NAME} runs in the platform plugin's "
        f"register(), and the patch set is not applied ({applied}/{total})"
    )


def check_plugins(
    ctx: Context,
    environ: Mapping[str, str] | None = None,
    ours: Mapping[str, str] | None = None,
    import_gap: Callable[[], str | None] = schema_gap,
) -> Finding:
    env = os.environ if environ is None else environ
    ours = our_entry_points() if ours is None else ours
    raw = env.get("VLLM_PLUGINS")
    details = {"VLLM_PLUGINS": raw, "entry_points": dict(ours)}
    if not ours:
        return Finding(
            "plugins",
            "fail",
            "vllm-kunlun's vLLM entry points are not installed (no "
            f"{PLATFORM_GROUP} / {GENERAL_GROUP} entry of vllm_kunlun): vLLM cannot "
            "load the plugin",
            "install the package (pip install --no-build-isolation -e . in the "
            "checkout), not just put it on PYTHONPATH",
            details,
        )
    names = ", ".join(sorted(ours))
    if raw is None:
        return Finding(
            "plugins",
            "ok",
            f"VLLM_PLUGINS unset: vLLM loads every plugin, ours included ({names})",
            details=details,
        )
    allowed = raw.split(",")
    missing = {name: group for name, group in ours.items() if name not in allowed}
    if not missing:
        return Finding(
            "plugins", "ok", f"VLLM_PLUGINS={raw} includes {names}", details=details
        )
    padded = sorted(a for a in allowed if a != a.strip() and a.strip() in missing)
    keep = [a.strip() for a in allowed if a.strip()]
    fixed = ",".join(dict.fromkeys([*keep, *sorted(missing)]))
    cause = f"VLLM_PLUGINS={raw!r} leaves out " + "; ".join(
        f"{name} ({group}): {_CONSEQUENCE[group]}"
        for name, group in sorted(missing.items())
    )
    if padded:
        cause += (
            f" (vLLM does not trim spaces: {', '.join(repr(a) for a in padded)} "
            "matches no plugin)"
        )
    fix = f"export VLLM_PLUGINS={fixed} (or unset VLLM_PLUGINS to load every plugin)"
    platform_missing = PLATFORM_GROUP in missing.values()
    gap = import_gap() if platform_missing else None
    if gap:
        cause += f"; {gap}"
        fix += "; to keep the platform plugin out, run `vllm-kunlun patch apply`"
    return Finding(
        "plugins",
        "fail" if platform_missing else "warn",
        cause,
        fix,
        {**details, "missing": sorted(missing), "import_vllm_config": gap},
    )
