"""The doctor's ``model_path`` check: ``--model``. A shorthand that looks local but does not exist
(``models/Qwen3.8`` for ``models/Qwen3.8-27B-W8A8-INT8-Dynamic``) makes vLLM treat it as
a Hugging Face Hub id: ``snapshot_download`` and an ``HFValidationError`` (or a network
timeout on an offline host) instead of "no such directory". The same function backs the
engine-start guard (vllm_kunlun/guards/model_path.py).

A model string "looks local" when it is absolute, starts with ``.``/``~``, has more than
one separator (a Hub id is ``org/name``), or its first component is an existing
directory. A plain ``org/name`` whose ``org`` is not a local directory is a Hub id.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from typing import Any

from vllm_kunlun.checks.config_file import ConfigFileError, read_config
from vllm_kunlun.checks.finding import Context, Finding

MAX_SUGGESTIONS = 3


def _parts(model: str) -> list[str]:
    return [p for p in model.replace(os.sep, "/").split("/") if p not in ("", ".")]


def _abs(model: str, cwd: str) -> str:
    return os.path.normpath(os.path.join(cwd, os.path.expanduser(model)))


def looks_local(model: str, cwd: str) -> bool:
    if os.path.isabs(model) or model.startswith((".", "~")):
        return True
    parts = _parts(model)
    if os.path.exists(_abs(model, cwd)):
        return True
    if len(parts) > 2:
        return True
    return len(parts) == 2 and os.path.isdir(os.path.join(cwd, parts[0]))


def suggestions(model: str, cwd: str, limit: int = MAX_SUGGESTIONS) -> list[str]:
    """Existing directories nearest to a missing local path, spelled like the input.

    Walk down the components the user typed while they exist; at the first missing one,
    offer the existing sibling directories whose names start with what was typed
    (``Qwen3.8`` -> ``Qwen3.8-27B-...``), or else the most similar spellings.
    """
    expanded = os.path.expanduser(model)
    prefix = "/" if os.path.isabs(expanded) else ""
    base = "/" if prefix else cwd
    parts = _parts(expanded)
    for i, part in enumerate(parts):
        here = os.path.join(base, *parts[:i])
        if os.path.isdir(os.path.join(here, part)):
            continue
        try:
            siblings = [e.name for e in os.scandir(here) if e.is_dir()]
        except OSError:
            return []
        typed = part.lower()

        def score(name: str, typed: str = typed) -> tuple[int, float]:
            starts = name.lower().startswith(typed) or typed.startswith(name.lower())
            ratio = difflib.SequenceMatcher(None, typed, name.lower()).ratio()
            return (1 if starts else 0, ratio)

        ranked = sorted(siblings, key=score, reverse=True)
        # Names that extend what was typed are the answer when there are any;
        # otherwise the close spellings (typos).
        keep = [n for n in ranked if score(n)[0]] or [
            n for n in ranked if score(n)[1] >= 0.6
        ]
        keep = keep[:limit]
        rest = parts[i + 1 :]
        return [prefix + "/".join([*parts[:i], n, *rest]) for n in keep]
    return []


@dataclass(frozen=True)
class PathVerdict:
    local: bool
    exists: bool
    path: str
    """Absolute path the engine would read (for a local model)."""
    suggestions: tuple[str, ...] = ()


def inspect_path(model: str, cwd: str) -> PathVerdict:
    path = _abs(model, cwd)
    local = looks_local(model, cwd)
    exists = os.path.exists(path)
    hints = tuple(suggestions(model, cwd)) if local and not exists else ()
    return PathVerdict(local, exists, path, hints)


def missing_path_message(
    model: str, verdict: PathVerdict, what: str = "model"
) -> tuple[str, str]:
    """(cause, fix) for a local-looking model path that does not exist."""
    cause = (
        f"{what} path {model!r} looks local but {verdict.path} does not exist "
        "(vLLM would treat it as a Hugging Face Hub id and fail with HFValidationError "
        "or a download error)"
    )
    if verdict.suggestions:
        fix = "did you mean " + " or ".join(repr(s) for s in verdict.suggestions) + "?"
    else:
        fix = "pass the full path of the model directory (the one with config.json)"
    return cause, fix


def architectures_of(config: dict[str, Any]) -> list[str]:
    """The ``architectures`` list; ConfigFileError when it is not a list of names
    (a plain string would otherwise read as a list of letters)."""
    raw = config.get("architectures")
    if raw is None:
        return []
    if isinstance(raw, str):
        raise ConfigFileError(
            f"config.json: 'architectures' is the string {raw!r}, not a list; "
            f'vLLM expects ["{raw}"]'
        )
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        raise ConfigFileError(
            f"config.json: 'architectures' must be a list of class names, got {raw!r}"
        )
    return raw


def vllm_architectures() -> set[str]:
    """Architectures vLLM 0.15.1 can load (its model registry)."""
    from vllm_kunlun.checks.vllm_import import ensure_vllm_importable

    ensure_vllm_importable()
    from vllm.model_executor.models.registry import ModelRegistry

    return set(ModelRegistry.get_supported_archs())


def plugin_architectures() -> dict[str, str]:
    """Architectures the plugin serves itself (registered with vLLM at engine start)."""
    from vllm_kunlun.models import ARCHITECTURES

    return dict(ARCHITECTURES)


def check_model_dir(path: str, details: dict[str, Any]) -> Finding:
    if not os.path.isdir(path):
        return Finding(
            "model_path",
            "fail",
            f"{path} is a file, not a model directory",
            "pass the directory that contains config.json",
            details,
        )
    try:
        config = read_config(path)
    except FileNotFoundError:
        below = [
            e.name
            for e in os.scandir(path)
            if e.is_dir() and os.path.isfile(os.path.join(e.path, "config.json"))
        ]
        fix = "pass the directory that contains config.json"
        if below:
            fix += "; model directories inside it: " + ", ".join(sorted(below)[:5])
        return Finding("model_path", "fail", f"no config.json in {path}", fix, details)
    except ConfigFileError as exc:
        return Finding(
            "model_path",
            "fail",
            f"config.json is unreadable: {exc}",
            "restore config.json from the model's original files",
            details,
        )
    except OSError as exc:
        return Finding(
            "model_path",
            "fail",
            f"{path}/config.json is unreadable: {exc.strerror or exc}",
            "restore config.json from the model's original files (and check its "
            "permissions)",
            details,
        )
    try:
        archs = architectures_of(config)
    except ConfigFileError as exc:
        return Finding(
            "model_path",
            "fail",
            f"{path}: {exc}",
            "fix the 'architectures' field of config.json (a list of class names, "
            'e.g. ["Qwen3ForCausalLM"])',
            details,
        )
    details.update(model_type=config.get("model_type"), architectures=archs)
    ours = plugin_architectures()
    known = vllm_architectures()
    served = [a for a in archs if a in known or a in ours]
    if not served:
        return Finding(
            "model_path",
            "fail",
            f"{path}: architectures {archs or '(none)'} (model_type "
            f"{config.get('model_type')!r}) are served neither by vLLM 0.15.1 nor "
            f"by vllm-kunlun ({', '.join(sorted(ours))})",
            "use a model whose architecture vLLM 0.15.1 or the plugin supports, or "
            "fix the 'architectures' field of config.json",
            details,
        )
    # vLLM's own implementation wins where both have one (models.register_models).
    by = "vLLM 0.15.1" if served[0] in known else "vllm-kunlun"
    details["served_by"] = by
    weights = [
        n for n in os.listdir(path) if n.endswith((".safetensors", ".bin", ".pt"))
    ]
    details["weight_files"] = len(weights)
    if not weights:
        return Finding(
            "model_path",
            "warn",
            f"{path}: {', '.join(archs)} config readable, but no weight files "
            "(*.safetensors / *.bin)",
            "copy the weight shards into the model directory (or pass --load-format "
            "dummy on purpose)",
            details,
        )
    return Finding(
        "model_path",
        "ok",
        f"{path}: {', '.join(archs)} ({config.get('model_type')}, served by {by}), "
        f"{len(weights)} weight file(s)",
        details=details,
    )


def check_model_path(ctx: Context) -> Finding:
    if not ctx.model:
        return Finding("model_path", "skip", "no --model given")
    verdict = inspect_path(ctx.model, ctx.cwd)
    details: dict[str, Any] = {
        "model": ctx.model,
        "cwd": ctx.cwd,
        "looks_local": verdict.local,
        "path": verdict.path,
        "exists": verdict.exists,
        "suggestions": list(verdict.suggestions),
    }
    if not verdict.local:
        return Finding(
            "model_path",
            "warn",
            f"{ctx.model!r} is not a local directory (relative to {ctx.cwd}): vLLM will "
            "fetch it from the Hugging Face Hub",
            "if it is meant to be local, pass the full path of the model directory",
            details,
        )
    if not verdict.exists:
        cause, fix = missing_path_message(ctx.model, verdict)
        return Finding("model_path", "fail", cause, fix, details)
    return check_model_dir(verdict.path, details)
