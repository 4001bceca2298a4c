"""Runtime patch ``schema_pep585``: torch < 2.6 schema inference for modern annotations.

Why: vLLM 0.15.1 registers custom ops whose signatures use ``list[int]`` and
``X | None``. torch 2.5.1's ``torch._library.infer_schema`` looks annotations up in a
table keyed by ``typing.List[int]`` / ``typing.Optional[X]`` only, so ``import
vllm.config`` dies in ``vllm/distributed/parallel_state.py``.
How: add the PEP 585 / PEP 604 spelling of every supported type to torch's lookup tables,
mapping to the same schema string. Nothing else in torch changes; ``revert()`` removes
exactly the keys we added.
Unnecessary from: torch 2.6, whose tables include these spellings (the patch is a no-op
there and is not applied).
"""

from __future__ import annotations

import collections.abc
import functools
import operator
import types
import typing
from typing import Any

import torch

NAME = "schema_pep585"

_added: dict[str, list[Any]] = {}


def needed() -> bool:
    """True on torch < 2.6, where the lookup tables lack the modern spellings."""
    from packaging.version import Version

    return Version(torch.__version__.split("+")[0]) < Version("2.6")


def modern_spelling(tp: Any) -> Any:
    """``typing.List[int]`` -> ``list[int]``, ``typing.Optional[X]`` -> ``X | None``."""
    origin = typing.get_origin(tp)
    if origin is None:
        return tp
    args = tuple(modern_spelling(a) for a in typing.get_args(tp))
    if origin is typing.Union:
        return functools.reduce(operator.or_, args)
    if origin in (list, collections.abc.Sequence):
        return types.GenericAlias(origin, args)
    return tp


def _extend(table: dict[Any, str], key: str) -> None:
    added = _added.setdefault(key, [])
    for tp, schema in list(table.items()):
        modern = modern_spelling(tp)
        if modern not in table:
            table[modern] = schema
            added.append(modern)


def apply() -> bool:
    """Apply once; returns True when the tables were changed by this call."""
    if _added or not needed():
        return False
    from torch._library import infer_schema as mod

    expected = ("SUPPORTED_PARAM_TYPES", "SUPPORTED_RETURN_TYPES")
    missing = [
        name for name in expected if not isinstance(getattr(mod, name, None), dict)
    ]
    if missing:
        raise RuntimeError(
            f"{NAME}: torch {torch.__version__} has no dict "
            f"torch._library.infer_schema.{'/'.join(missing)}; this patch was written for "
            "torch 2.5.1. Use torch 2.5.1 (the validated version) or disable the patch "
            "with VLLM_KUNLUN_SCHEMA_FIX=0."
        )
    _extend(mod.SUPPORTED_PARAM_TYPES, "SUPPORTED_PARAM_TYPES")
    _extend(mod.SUPPORTED_RETURN_TYPES, "SUPPORTED_RETURN_TYPES")
    return True


def apply_fix() -> bool:
    """``apply`` unless ``VLLM_KUNLUN_SCHEMA_FIX=0``, saying what it did or what breaks.

    Without it ``import vllm.config`` fails on torch 2.5.1, so even client-only commands
    (``vllm bench serve --help``) die on a host without a Kunlun device: ``register()``
    applies it (``Phase.PROCESS_START``) before it decides anything, since vLLM resolves
    its platform (and so calls ``register()``) just before it registers its first
    custom op. Idempotent.
    """
    from vllm_kunlun import envs
    from vllm_kunlun.logger import init_logger  # vLLM's logger: not for the CLI

    logger = init_logger(__name__)
    if envs.VLLM_KUNLUN_SCHEMA_FIX:
        if apply():
            logger.info(
                "vllm-kunlun: runtime patch %s applied (torch %s infers custom-op "
                "schemas from list[int] / X | None)",
                NAME,
                torch.__version__,
            )
            return True
    elif needed():
        logger.warning_once(
            "vllm-kunlun: VLLM_KUNLUN_SCHEMA_FIX=0 on torch < 2.6: importing vllm.config "
            "will fail in vllm/distributed/parallel_state.py unless the patch set is "
            "applied (vllm-kunlun patch apply)"
        )
    return False


# phases.apply_phase's hook (patching/phases.py)
RUNTIME_PATCHES = {NAME: lambda phase: apply_fix()}


def applied() -> bool:
    return bool(_added)


def revert() -> None:
    from torch._library import infer_schema as mod

    for name, keys in _added.items():
        table = getattr(mod, name)
        for key in keys:
            table.pop(key, None)
    _added.clear()


def state() -> str:
    """One line for ``vllm-kunlun patch status`` and the doctor."""
    from vllm_kunlun import envs

    if not needed():
        return f"not needed: torch {torch.__version__} infers these schemas itself"
    if applied():
        return "applied: torch infers custom-op schemas from list[int] / X | None"
    if not envs.VLLM_KUNLUN_SCHEMA_FIX:
        return (
            "OFF (VLLM_KUNLUN_SCHEMA_FIX=0): import vllm.config fails unless the "
            "patch set is applied"
        )
    return (
        f"needed on torch {torch.__version__} (import vllm.config); applied by the "
        "platform plugin in every vLLM process that loads it (VLLM_PLUGINS)"
    )
