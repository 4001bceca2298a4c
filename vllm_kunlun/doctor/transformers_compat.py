"""The doctor's ``transformers_compat`` check: the transformers attributes vLLM 0.15.1 reads, checked by behaviour.

vLLM 0.15.1's Qwen2-VL family (qwen2_vl.py, also used by Qwen2.5-VL and Qwen3-VL
processing) reads ``image_processor.min_pixels`` / ``.max_pixels`` and
``.size["longest_edge"]`` while it sizes the multimodal budget at engine start;
transformers 5.5.x dropped ``max_pixels`` and the engine core died with AttributeError.
``hasattr(Qwen2VLImageProcessor, "max_pixels")`` is False even on the good 5.2.0 (the
attribute is set in ``__init__``), so the check builds an instance offline (default
arguments, no download) and reads the attributes the way vLLM does. The fast processor
(torchvision) keeps both attributes but leaves them None with the bounds in ``size``;
vLLM's Qwen3-VL path (Qwen3.5 included) reads ``size`` and ``max_pixels or
size["longest_edge"]``, so None with readable ``size`` bounds passes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vllm_kunlun.checks.finding import Context, Finding
from vllm_kunlun.versions import install_hint

FIX = install_hint("transformers")

# (module, class) pairs vLLM may get from AutoImageProcessor for Qwen2-VL models.
PROCESSORS = (
    ("transformers.models.qwen2_vl.image_processing_qwen2_vl", "Qwen2VLImageProcessor"),
    (
        "transformers.models.qwen2_vl.image_processing_qwen2_vl_fast",
        "Qwen2VLImageProcessorFast",
    ),
)


def _import(module: str, name: str) -> tuple[type | None, str]:
    import importlib

    try:
        return getattr(importlib.import_module(module), name), ""
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


def probe_processor(cls: Callable[[], Any]) -> list[str]:
    """What vLLM 0.15.1 would fail to read on a default instance of ``cls``."""
    instance = cls()
    problems = []
    size = getattr(instance, "size", None)
    edges = {}
    for edge in ("shortest_edge", "longest_edge"):
        try:
            edges[edge] = size[edge]  # type: ignore[index]
        except Exception:
            if edge == "longest_edge":
                problems.append(f'.size["longest_edge"] unreadable (size={size!r})')
    for attr, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        try:
            value = getattr(instance, attr)
        except AttributeError:
            problems.append(f"instance has no .{attr}")
            continue
        if value is None and isinstance(edges.get(edge), int):
            continue  # the bound is in size, where vLLM's Qwen3-VL path reads it
        if not isinstance(value, int):
            problems.append(f".{attr} is {value!r}, not an int")
    return problems


def check_transformers_compat(
    ctx: Context,
    processors: Sequence[tuple[str, Callable[[], Any] | None, str]] | None = None,
) -> Finding:
    """``processors``: (name, class or None, why not importable); default: transformers'.

    The slow processor must import; the fast one needs torchvision and is skipped
    (with the reason in the details) when it does not import.
    """
    if processors is None:
        found: list[tuple[str, Callable[[], Any] | None, str]] = []
        for module, name in PROCESSORS:
            cls, why = _import(module, name)
            found.append((name, cls, why))
        processors = found
    import transformers

    details: dict[str, Any] = {
        "transformers": getattr(transformers, "__version__", "?")
    }
    broken: list[str] = []
    for i, (name, factory, why) in enumerate(processors):
        if factory is None:
            details[name] = f"not importable ({why})"
            if i == 0:
                broken.append(f"{name} does not import ({why})")
            continue
        problems = probe_processor(factory)
        details[name] = {
            "instance_ok": not problems,
            "problems": problems,
            "class_hasattr_max_pixels": hasattr(factory, "max_pixels"),
        }
        broken += [f"{name}: {p}" for p in problems]
    if broken:
        return Finding(
            "transformers_compat",
            "fail",
            f"transformers {details['transformers']}: "
            + "; ".join(broken)
            + " (vLLM 0.15.1 reads it at engine start)",
            FIX,
            details,
        )
    return Finding(
        "transformers_compat",
        "ok",
        f"transformers {details['transformers']}: Qwen2-VL image processor instances "
        "have min_pixels / max_pixels as vLLM 0.15.1 reads them",
        details=details,
    )
