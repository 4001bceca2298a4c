"""Named runtime patches of module attributes: the one mechanism behind every runtime
change the plugin makes to vLLM (sampling, engine guards).

A patch replaces one module attribute, keeps the original, checks first that the
upstream object looks like the one it was written for (and says what differs when it
does not), and can be reverted. ``attr`` may be dotted (``"Class.method"``): the last
name is replaced on the object the others lead to. A patch that adds an attribute an
older release lacks (``may_be_absent``) sees ``None`` as the original and deletes the
attribute on revert.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, NamedTuple

from vllm_kunlun.versions import WRITTEN_FOR_VLLM

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
        """Why the installed vLLM does not look like what this patch expects, or None.

        Once applied, the check vets the object this patch replaced, not its own
        replacement: asking an applied patch (the doctor does) must not report drift.
        """
        try:
            module = importlib.import_module(self.module)
        except Exception as exc:
            return f"{self.module} does not import ({type(exc).__name__}: {exc})"
        original = self._original if self._active else _lookup(module, self.attr)
        if original is _MISSING:
            if not self.may_be_absent:
                return f"{self.target} does not exist"
            original = None
        return self.check(module, original)

    def _owner(self) -> tuple[Any, str]:
        """The object that holds the replaced name, and that name."""
        *path, name = self.attr.split(".")
        owner: Any = sys.modules[self.module]
        for part in path:
            owner = getattr(owner, part)
        return owner, name

    def apply(self) -> bool:
        """Install the replacement; False when already installed."""
        if self.applied():
            return False
        problem = self.mismatch()
        if problem is not None:
            raise PatchMismatch(
                f"runtime patch {self.name} not applied: {problem}. {WRITTEN_FOR_VLLM}"
            )
        owner, name = self._owner()
        current = getattr(owner, name, _MISSING)
        # The owner's own entry when it has one: revert puts back exactly that object
        # (a staticmethod / classmethod wrapper, not what attribute access returns).
        original = vars(owner).get(name, current)
        setattr(owner, name, self.make(None if current is _MISSING else current))
        self._original = original
        self._active = True
        return True

    def apply_or_warn(self, without: str) -> bool:
        """``apply`` for a guard vLLM can run without (``apply_group_or_warn``)."""
        return apply_group_or_warn((self,), without)

    def revert(self) -> None:
        if not self.applied():
            return
        owner, name = self._owner()
        if self._original is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, self._original)
        self._original = _MISSING
        self._active = False


def _lookup(module: ModuleType, dotted: str) -> Any:
    obj: Any = module
    for part in dotted.split("."):
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            break
    return obj


def platform_resolved() -> bool:
    """True once vLLM's ``current_platform`` exists.

    The platform constructor calls ``apply_runtime_fixes`` while vLLM is still
    resolving ``current_platform``; importing ``vllm.v1.sample`` then would re-enter
    that resolution. The ``vllm.general_plugins`` entry point calls it again later, in
    every process, before any model runner builds its sampler.
    """
    platforms = sys.modules.get("vllm.platforms")
    return getattr(platforms, "_current_platform", None) is not None


def apply_group(patches: tuple[AttributePatch, ...]) -> bool:
    """All patches of one registry entry, or none; True when this call applied them.

    Every target is checked before any is replaced, and a failure part-way reverts
    what this call installed, so no half-patched state is ever left.
    """
    if group_applied(patches):
        return False
    for p in patches:
        problem = None if p.applied() else p.mismatch()
        if problem is not None:
            raise PatchMismatch(
                f"runtime patch {p.name} not applied: {problem}. {WRITTEN_FOR_VLLM}"
            )
    done: list[AttributePatch] = []
    try:
        for p in patches:
            if p.apply():
                done.append(p)
    except Exception:
        for p in reversed(done):
            p.revert()
        raise
    return True


def apply_group_or_warn(patches: tuple[AttributePatch, ...], without: str) -> bool:
    """``apply_group`` for a guard vLLM can run without: a target that differs is one
    warning naming what differs and what the process does ``without`` the guard, never
    a failed start. True when this call installed the group."""
    from vllm_kunlun.logger import init_logger  # vLLM's logger: not for the CLI

    logger = init_logger(__name__)
    try:
        done = apply_group(patches)
    except PatchMismatch as exc:
        logger.warning_once("vllm-kunlun: %s; %s", str(exc), without)
        return False
    if done:
        logger.debug("vllm-kunlun: runtime patch %s installed", patches[0].name)
    return done


def group_applied(patches: tuple[AttributePatch, ...]) -> bool:
    return all(p.applied() for p in patches)


def revert_group(patches: tuple[AttributePatch, ...]) -> None:
    """Put every original back, last patch first."""
    for p in reversed(patches):
        p.revert()


class PatchGroups:
    """A module's registry entries, each an all-or-nothing group of patches: applied
    one entry at a time (``apply``; a mismatch raises), listed (``applied``), reverted
    together (``revert_all``); ``hooks()`` is the module's ``RUNTIME_PATCHES``.

    ``skip(name)`` says why an entry is not needed in this process (None: apply it);
    such an entry is left out with one log line."""

    def __init__(
        self,
        groups: dict[str, tuple[AttributePatch, ...]],
        what: str,
        skip: Callable[[str], str | None] | None = None,
    ) -> None:
        self.groups = groups
        self.what = what
        self.skip = skip

    def apply(self, name: str) -> bool:
        """Apply entry ``name`` (all its patches or none); True when this call did."""
        from vllm_kunlun.logger import init_logger  # vLLM's logger: not for the CLI

        logger = init_logger(__name__)
        why = self.skip(name) if self.skip is not None else None
        if why:
            logger.info_once("vllm-kunlun: %s not applied: %s", name, why)
            return False
        if not apply_group(self.groups[name]):
            return False
        logger.info("vllm-kunlun: %s runtime patch %s applied", self.what, name)
        return True

    def hooks(self) -> dict[str, Callable[[Any], bool]]:
        """``phases.apply_phase``'s hook per entry (patching/phases.py)."""

        def hook(name: str) -> Callable[[Any], bool]:
            return lambda phase: self.apply(name)

        return {name: hook(name) for name in self.groups}

    def revert_all(self) -> None:
        for patches in reversed(list(self.groups.values())):
            revert_group(patches)

    def applied(self) -> list[str]:
        return [name for name, ps in self.groups.items() if group_applied(ps)]


class OptionalPatch:
    """One registry entry vLLM can run without (a guard, a bounded wait): its patches
    go in together or not at all, and a mismatch is a warning naming what is lost
    (``apply_group_or_warn``). ``only_where`` names a module that must already be
    imported for the entry to apply (the API server's: importing it only to patch it
    would cost seconds in every engine and worker process). A module binds its
    ``install`` / ``installed`` / ``uninstall`` and ``RUNTIME_PATCHES`` from
    ``bindings()``."""

    def __init__(
        self,
        name: str,
        patches: tuple[AttributePatch, ...],
        without: str,
        only_where: str | None = None,
    ) -> None:
        self.name = name
        self.patches = patches
        self.without = without
        self.only_where = only_where

    def install(self) -> bool:
        """True when this call installed the entry."""
        if self.only_where is not None and self.only_where not in sys.modules:
            return False
        return apply_group_or_warn(self.patches, self.without)

    def installed(self) -> bool:
        return group_applied(self.patches)

    def uninstall(self) -> None:
        revert_group(self.patches)

    def hooks(self) -> dict[str, Callable[[Any], bool]]:
        """``phases.apply_phase``'s hook (patching/phases.py)."""
        return {self.name: lambda phase: self.install()}

    def bindings(self) -> OptionalBindings:
        """``install, installed, uninstall, RUNTIME_PATCHES = GUARD.bindings()``: the
        names a guard or fix module binds (the last is ``phases.apply_phase``'s hook)."""
        return OptionalBindings(
            self.install, self.installed, self.uninstall, self.hooks()
        )


class OptionalBindings(NamedTuple):
    """What a module built on one ``OptionalPatch`` exposes."""

    install: Callable[[], bool]
    installed: Callable[[], bool]
    uninstall: Callable[[], None]
    runtime_patches: dict[str, Callable[[Any], bool]]


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


def expect_caller(module: ModuleType, caller: str, name: str) -> str | None:
    """``caller``, a function or ``Class.method`` of ``module``, still calls ``name`` by
    its module-level name (the patch replaces that name, so the call must look it up)."""
    found = _lookup(module, caller)
    return expect_call(None if found is _MISSING else found, caller, name)


def expect_call(fn: Any, what: str, name: str) -> str | None:
    """``fn`` (or what it wraps: another patch may have wrapped it) calls ``name``."""
    if fn is not None:
        fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is None or name not in code.co_names:
        return f"{what} no longer calls {name} by its module-level name"
    return None
