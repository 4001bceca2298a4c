"""Named runtime patches of module attributes: the one mechanism behind every runtime
change the plugin makes to vLLM (sampling, engine guards).

A patch replaces one module attribute, keeps the original, checks first that the
upstream object looks like the one it was written for (and says what differs when it
does not), and can be reverted. A patch that adds an attribute an older release lacks
(``may_be_absent``) sees ``None`` as the original and deletes the attribute on revert.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

_MISSING = object()


@dataclass
class AttributePatch:
    """Replace ``module.attr`` with ``make(original)``; ``check`` vets the original."""

    name: str
    module: str
    attr: str
    make: Callable[[Any], Any]
    check: Callable[[ModuleType, Any], str | None]
    may_be_absent: bool = False
    _original: Any = field(default=_MISSING, repr=False)
    _active: bool = field(default=False, repr=False)

    @property
    def target(self) -> str:
        return f"{self.module}.{self.attr}"

    def applied(self) -> bool:
        return self._active

    def mismatch(self) -> str | None:
        """Why the installed vLLM does not look like what this patch expects, or None."""
        try:
            module = importlib.import_module(self.module)
        except Exception as exc:
            return f"{self.module} does not import ({type(exc).__name__}: {exc})"
        original = getattr(module, self.attr, _MISSING)
        if original is _MISSING:
            if not self.may_be_absent:
                return f"{self.target} does not exist"
            original = None
        return self.check(module, original)

    def apply(self) -> bool:
        """Install the replacement; False when already installed."""
        if self.applied():
            return False
        problem = self.mismatch()
        if problem is not None:
            raise PatchMismatch(
                f"runtime patch {self.name} not applied: {problem}. It was written for "
                "vLLM 0.15.1 (the validated version); install vllm==0.15.1 or "
                "use a vllm-kunlun release written for this vLLM."
            )
        module = sys.modules[self.module]
        original = getattr(module, self.attr, _MISSING)
        setattr(
            module, self.attr, self.make(None if original is _MISSING else original)
        )
        self._original = original
        self._active = True
        return True

    def revert(self) -> None:
        if not self.applied():
            return
        module = sys.modules[self.module]
        if self._original is _MISSING:
            delattr(module, self.attr)
        else:
            setattr(module, self.attr, self._original)
        self._original = _MISSING
        self._active = False


class PatchMismatch(RuntimeError):
    """The upstream object differs from what a patch was written for."""


def params(fn: Any) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return ()


def expect_params(fn: Any, what: str, expected: tuple[str, ...]) -> str | None:
    found = params(fn)
    if found != expected:
        return f"{what} takes {found}, expected {expected}"
    return None


def expect_call(fn: Any, what: str, name: str) -> str | None:
    code = getattr(fn, "__code__", None)
    if code is None or name not in code.co_names:
        return f"{what} no longer calls {name} by its module-level name"
    return None
