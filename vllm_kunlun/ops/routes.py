"""Routes from vLLM's ops to vendor kernels, with the reason whenever one is not taken.

Why: every vendor path (attention, norms, rotary embedding, activations) asks the same
three questions: does the active platform want vendor kernels at all, does the
installed vendor library have the functions, did the kernel refuse these inputs.
Answering them in one place keeps the answers and their log lines alike everywhere, and
lets the serving report say which kernels actually served (a silent fallback is the
failure behind the decode stall, docs/deployment-log.md D11).

How: a ``Route`` holds one op family's vendor functions, resolved when a layer is built
through ``ops/chooser.py`` (the active platform's policy: KunlunPlatform yes, host
emulation only with ``VLLM_KUNLUN_EMULATION_VENDOR=1``; the choice logged once). ``Route.run`` calls the
vendor implementation and falls back to vLLM's native one when the route is not ready,
when the implementation raises ``Refused`` (inputs the call form cannot express), or
when the kernel itself raises (the route is then closed for that layer). Every fallback
reason is logged once per process and counted; ``status()`` sums the routes of this
process for the serving report.

Removal: never; this is the seam between vLLM's ops and the vendor library.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch

from vllm_kunlun.logger import init_logger
from vllm_kunlun.ops import chooser, vendor

logger = init_logger(__name__)

VENDOR_MODULE = "kunlun_ops"
Kernels = Mapping[str, Callable[..., Any]]
T = TypeVar("T")

# Every float dtype the plugin's platforms run models in.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class Refused(Exception):
    """The vendor call form cannot take these inputs; the message says why."""


_ROUTES: list[Route] = []


class Route:
    """One op family's vendor functions, resolved when a layer is built."""

    def __init__(
        self,
        op: str,
        names: Sequence[str],
        family: chooser.Family = chooser.CUSTOM_OPS,
    ) -> None:
        self.op = op
        self.names = tuple(names)
        self.vendor_calls = 0
        self.native_calls = 0
        self.reasons: set[str] = set()
        choice = chooser.choose(family, None, vendor=self._load, op=op)
        self.kernels: dict[str, Callable[..., Any]] = choice.vendor or {}
        self.reason = "" if choice.name == chooser.VENDOR else choice.reason
        self.ready = not self.reason
        _ROUTES.append(self)

    def _load(self) -> tuple[dict[str, Callable[..., Any]] | None, str]:
        kernels = {}
        for name in self.names:
            fn, found = vendor.function(VENDOR_MODULE, name)
            if fn is None:
                return None, found
            kernels[name] = fn
        return kernels, ", ".join(f"{VENDOR_MODULE}.{n}" for n in self.names)

    def run(
        self,
        vendor_impl: Callable[..., T],
        native_impl: Callable[..., T],
        *args: Any,
    ) -> T:
        """``vendor_impl(kernels, *args)`` when it can, else ``native_impl(*args)``.

        The fallback runs on the same ``args`` after the kernel may have started, so a
        ``vendor_impl`` must never write into its arguments: a kernel that works in
        place gets copies (see ``ops/custom_ops/rotary_vendor.py``), else a kernel that wrote and then
        raised would have its op applied twice.
        """
        if self.ready:
            try:
                result = vendor_impl(self.kernels, *args)
            except Refused as exc:
                self.note_native(str(exc))
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as exc:
                self.ready = False
                self.reason = f"the kernel raised {type(exc).__name__}: {exc}"
                self.note_native(self.reason)
            else:
                self.vendor_calls += 1
                return result
        else:
            self.note_native(self.reason)
        return native_impl(*args)

    def note_native(self, reason: str) -> None:
        self.native_calls += 1
        if reason not in self.reasons:
            self.reasons.add(reason)
            logger.warning_once(
                "vllm-kunlun: %s falls back to vLLM's native torch path: %s",
                self.op,
                reason,
            )


def status() -> dict[str, dict[str, Any]]:
    """Per op family in this process: the kernels, modules, calls and fallback reasons."""
    out: dict[str, dict[str, Any]] = {}
    for route in _ROUTES:
        entry = out.setdefault(
            route.op,
            {
                "kernels": [f"{VENDOR_MODULE}.{n}" for n in route.names],
                "modules": 0,
                "vendor_modules": 0,
                "vendor_calls": 0,
                "native_calls": 0,
                "native_reasons": [],
            },
        )
        entry["modules"] += 1
        entry["vendor_modules"] += int(route.ready)
        entry["vendor_calls"] += route.vendor_calls
        entry["native_calls"] += route.native_calls
        entry["native_reasons"] = sorted({*entry["native_reasons"], *route.reasons})
    return out


def forget_routes() -> None:
    """Drop every route of this process (tests)."""
    _ROUTES.clear()
