"""The validated combination: one table for the README, the doctor and engine guards.

Every version the plugin names and every install command it prints comes from here
(``component``, ``install_hint``, ``REINSTALL_VLLM``), so one edit moves them all.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

__version__ = "0.1.0"
"""The plugin's own version; setup.py reads this line, the package re-exports it."""


@dataclass(frozen=True)
class Component:
    name: str
    """Distribution name as pip knows it."""
    validated: str | None
    """Exact validated version; None for vendor builds without a public version."""
    vendor: bool
    """Vendor wheel (not on PyPI): present on Kunlun hosts only."""
    install: str
    """The command that installs the validated version."""
    note: str = ""
    known_broken: str = ""
    """PEP 440 specifier of releases known to break the stack (refused at engine
    start, not just warned about); empty when none is known."""

    def is_known_broken(self, installed: str) -> bool:
        from packaging.specifiers import SpecifierSet

        return bool(self.known_broken) and release(installed) in SpecifierSet(
            self.known_broken
        )


VALIDATED: tuple[Component, ...] = (
    Component(
        "vllm",
        "0.15.1",
        False,
        "pip install --no-deps vllm==0.15.1",
        "--no-deps: its metadata pins torch 2.9.1 and transformers<5",
    ),
    Component(
        "torch",
        "2.5.1",
        False,
        "pip install torch==2.5.1 (on Kunlun: the vendor's xpytorch 2.5.1 wheel)",
    ),
    Component(
        "transformers",
        "5.2.0",
        False,
        "pip install --no-deps --force-reinstall transformers==5.2.0",
        "5.5.x removed Qwen2VLImageProcessor.max_pixels, which vllm 0.15.1 reads",
        known_broken=">=5.5",
    ),
    Component(
        "torchvision",
        "0.20.1",
        False,
        "pip install --no-deps torchvision==0.20.1 (on Kunlun: the torchvision build "
        "for the vendor's torch 2.5.1)",
        "images and video: vllm 0.15.1's Qwen-VL processors import it",
    ),
    Component(
        "kunlun_ops",
        "0.1.58",
        True,
        "install the vendor wheel kunlun_ops 0.1.58",
        "matches only the 0.15.1-era plugin API",
    ),
    Component("xspeedgate_ops", None, True, "install the vendor wheel xspeedgate_ops"),
    Component("cocopod", None, True, "install the vendor wheel cocopod"),
    Component("triton", None, True, "install the vendor triton build"),
    Component(
        "vllm-kunlun", __version__, False, "pip install --no-build-isolation -e ."
    ),
)


RAY_VERSION = "2.60.0"
"""The Ray the lock pins (requirements/stack.lock), for vLLM's Ray executor; every node
of a cluster needs the same one."""
RAY_INSTALL = f"pip install ray=={RAY_VERSION}"


def component(name: str) -> Component:
    """The table's row for ``name`` (a distribution name); KeyError when absent."""
    for c in VALIDATED:
        if c.name == name:
            return c
    raise KeyError(f"{name} is not in the validated combination")


def validated_version(name: str) -> str | None:
    """The exact validated version; None for vendor builds without one."""
    return component(name).validated


def install_hint(name: str) -> str:
    """The command that installs the validated ``name``."""
    return component(name).install


def label(name: str) -> str:
    """'kunlun_ops 0.1.58', or 'xspeedgate_ops' for a build without a pinned version."""
    version = validated_version(name)
    return f"{name} {version}" if version else name


VENDOR_LIBS_HINT = (
    f"install the vendor op libraries of the validated combination "
    f"({label('kunlun_ops')}, {label('xspeedgate_ops')})"
)


def reinstall_vllm(version: str | None = None) -> str:
    """The command that puts back pristine vLLM files (default: the validated vLLM)."""
    return f"pip install --no-deps --force-reinstall vllm=={version or validated_version('vllm')}"


REINSTALL_VLLM = reinstall_vllm()
"""Restores pristine vLLM files (drift, a half-applied patch set)."""

WRITTEN_FOR_VLLM = (
    f"It was written for vLLM {validated_version('vllm')} (the validated version); "
    f"{install_hint('vllm')}, or use a vllm-kunlun release written for this vLLM."
)
"""The fix when an upstream object differs from what a runtime patch expects."""


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def release(version: str) -> str:
    """'2.5.1+cu124' -> '2.5.1': local build tags do not change the API."""
    return version.split("+")[0]


@dataclass(frozen=True)
class VersionCheck:
    component: Component
    installed: str | None
    status: str
    """'ok', 'mismatch', 'missing' (PyPI stack), 'absent' (vendor, off Kunlun), 'info'."""

    @property
    def message(self) -> str:
        c = self.component
        if self.status == "ok":
            return f"{c.name} {self.installed}"
        if self.status == "mismatch":
            return (
                f"{c.name} {self.installed} is installed, validated is {c.validated}: "
                f"{c.install}"
            )
        if self.status == "missing":
            return f"{c.name} is not installed, validated is {c.validated}: {c.install}"
        if self.status == "absent":
            return f"{c.name} not installed (vendor wheel, needed on Kunlun hosts only)"
        return f"{c.name} {self.installed} (vendor build, no pinned version)"


def check_component(c: Component, installed: str | None) -> VersionCheck:
    if installed is None:
        return VersionCheck(c, None, "absent" if c.vendor else "missing")
    if c.validated is None:
        return VersionCheck(c, installed, "info")
    ok = release(installed) == c.validated
    return VersionCheck(c, installed, "ok" if ok else "mismatch")


def check_stack() -> list[VersionCheck]:
    return [check_component(c, installed_version(c.name)) for c in VALIDATED]
