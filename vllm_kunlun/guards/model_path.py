"""Runtime patch ``engine_model_path_guard`` (doctor check ``model_path`` at engine start):
a ``--model`` / ``--tokenizer`` that looks local but does not exist raises
``ModelPathError`` naming the nearest existing directories.

Why here: vLLM reads the model path before any platform hook that receives it:
``EngineArgs.create_engine_config`` first resolves speculators
(``maybe_override_with_speculators`` -> ``get_config_dict``, which sends a missing path to
the Hub: HFValidationError), then builds ``ModelConfig``; with ``HF_HUB_OFFLINE=1``
``EngineArgs.__post_init__`` already calls ``get_model_path``. ``check_and_update_config``
runs after ``ModelConfig`` (too late) and ``pre_register_and_update()`` gets no arguments.
How: wrap those two readers, the module-level
``vllm.engine.arg_utils.maybe_override_with_speculators`` and ``.get_model_path``
(both or neither). Installed from the platform's ``pre_register_and_update``, which vLLM
calls as the first statement of ``create_engine_config`` and while it builds the CLI
parser (``vllm serve``: before ``EngineArgs`` exists, so the offline path is covered too),
and from the general plugin. ``create_engine_config`` looks the wrapped names up at call
time, so the guard already acts in the call that installed it. The originals are kept,
their upstream signatures are checked (the patch stays out, with a warning, when they
differ) and ``uninstall()`` restores them.
Removal: when vLLM checks local paths before the Hub.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from vllm_kunlun.checks.model_path import inspect_path, missing_path_message
from vllm_kunlun.patching.attribute import AttributePatch, OptionalPatch, expect_params

NAME = "engine_model_path_guard"
# The upstream signatures the wrappers were written for (vllm 0.15.1).
_EXPECTED = {
    "maybe_override_with_speculators": [
        "model",
        "tokenizer",
        "trust_remote_code",
        "revision",
        "vllm_speculative_config",
        "kwargs",
    ],
    "get_model_path": ["model", "revision"],
}


class ModelPathError(ValueError):
    """A local-looking model path that does not exist (instead of HFValidationError)."""


def model_path_guard(model: Any, what: str = "model", cwd: str | None = None) -> None:
    """Raise ModelPathError when ``model`` looks local but does not exist."""
    if not isinstance(model, (str, os.PathLike)):
        return
    model = os.fspath(model)
    verdict = inspect_path(model, cwd or os.getcwd())
    if verdict.local and not verdict.exists:
        cause, fix = missing_path_message(model, verdict, what)
        raise ModelPathError(f"vllm-kunlun: {cause}. Fix: {fix}")


def _check_signature(expected: list[str]) -> Callable[[ModuleType, Any], str | None]:
    def check(module: ModuleType, original: Any) -> str | None:
        return expect_params(original, original.__name__, tuple(expected))

    return check


def _make_speculators_guard(speculators: Any) -> Any:
    spec_sig = inspect.signature(speculators)

    @functools.wraps(speculators)
    def guarded_speculators(*args: Any, **kwargs: Any) -> Any:
        bound = spec_sig.bind(*args, **kwargs)
        model, tokenizer = bound.arguments["model"], bound.arguments["tokenizer"]
        model_path_guard(model)
        if tokenizer and tokenizer != model:
            model_path_guard(tokenizer, what="tokenizer")
        return speculators(*args, **kwargs)

    return guarded_speculators


def _make_get_model_path_guard(get_model_path: Any) -> Any:
    @functools.wraps(get_model_path)
    def guarded_get_model_path(model: Any, revision: Any = None) -> Any:
        model_path_guard(model)
        return get_model_path(model, revision)

    return guarded_get_model_path


_PATCHES = tuple(
    AttributePatch(
        NAME,
        "vllm.engine.arg_utils",
        attr,
        make,
        _check_signature(_EXPECTED[attr]),
    )
    for attr, make in (
        ("maybe_override_with_speculators", _make_speculators_guard),
        ("get_model_path", _make_get_model_path_guard),
    )
)


# Both wrappers or neither. Needs ``vllm.engine.arg_utils`` fully imported: callers
# are the general plugin (top of ``EngineArgs.__post_init__``) and the platform's
# ``pre_register_and_update`` (``create_engine_config``, CLI parser), all inside
# arg_utils' own functions.
GUARD = OptionalPatch(
    NAME, _PATCHES, "a missing local model path will surface as vLLM's own error"
)
install, installed, uninstall, RUNTIME_PATCHES = GUARD.bindings()
