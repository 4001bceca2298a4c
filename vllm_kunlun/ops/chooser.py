"""The one chooser of a kernel path: vendor, Triton, native (CPU) or portable torch.

Why one: every kernel family (sampling, W8A8 int8 linear, Gated DeltaNet, MoE, the
vendor CustomOps, attention) faces the same choice, and three choosers with two policies
answered it differently (GDN ignored host emulation's switch). A silent or inconsistent
fallback is how the decode stall happened (docs/deployment-log.md D11), so the policy,
the explicit switches, the error texts and the log lines live here once.

Policy (the active platform's, asked of vLLM through ``ops/active_platform.py``):
KunlunPlatform wants the vendor kernels; host emulation only with
``VLLM_KUNLUN_EMULATION_VENDOR=1``; any other vLLM platform never. ``auto`` takes, in
order, the vendor kernel (when the policy wants it, one is wired for the op, the
tensors are on the platform's device and it loads; a kernel that does not load is
warned about once), the native CPU kernel (CPU tensors, when the extension prefers
it), vLLM's Triton kernel (device tensors, an active driver), else portable torch; the
reason names every path passed over. A family's ``VLLM_KUNLUN_*`` switch may demand
one path: it is taken or a RuntimeError names the cause and the fix. Only this module
reads those switches (a test checks it). Each choice is logged once with its reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch

from vllm_kunlun import envs, versions
from vllm_kunlun.logger import init_logger
from vllm_kunlun.ops.active_platform import active_plugin_platform

logger = init_logger(__name__)

T = TypeVar("T")
K = TypeVar("K")

AUTO = "auto"
VENDOR = "vendor"
TRITON = "triton"
NATIVE = "native"
PORTABLE = "portable"

Loader = Callable[[], "tuple[T | None, str]"]
Probe = Callable[[], "tuple[bool, str]"]


class NativeKernel(Protocol):
    """The plugin's CPU extension as the chooser asks it (``ops/sampling/native_cpu``)."""

    def available(self) -> tuple[bool, str]:
        """Whether it loads at all (what a demanded ``native`` needs)."""

    def preferred(self) -> tuple[bool, str]:
        """Whether ``auto`` should take it (it loads and beats portable torch here)."""


@dataclass(frozen=True)
class Family:
    """One kernel family: its name in log lines, its switch and what it runs on."""

    label: str
    variable: str | None  # its VLLM_KUNLUN_* switch; None: always auto
    subject: str = "the tensors"
    vendor_fix: str = (
        "Install the vendor op library of the validated combination "
        f"({versions.label('kunlun_ops')})"
    )
    # Its caller warns at the first call that falls back (ops/routes.py): the chooser
    # then logs the choice only, so the cause is not warned about twice.
    caller_warns: bool = False


SAMPLING = Family("sampling", "VLLM_KUNLUN_SAMPLER", subject="the logits")
INT8_MM = Family(
    "W8A8 int8 linear",
    "VLLM_KUNLUN_INT8_MM",
    vendor_fix=versions.VENDOR_LIBS_HINT[0].upper() + versions.VENDOR_LIBS_HINT[1:],
)
GDN = Family("GDN", "VLLM_KUNLUN_GDN")
# No switch: the vendor block serves float, non-expert-parallel layers where the policy
# wants vendor kernels; every other MoE layer runs portable (ops/moe/seam.py).
MOE = Family("MoE", None)
CUSTOM_OPS = Family("CustomOp", None, caller_warns=True)
ATTENTION = Family("attention", None)
# No switch: vendor bgmv where the policy wants vendor kernels, else portable.
LORA = Family("LoRA", None)
# No switch: the vendor MLA cache write and decode where the policy wants vendor
# kernels, else portable (ops/mla/seam.py).
MLA = Family("MLA attention", None)
# No switch: vendor gptq_gemm for symmetric weight-only layers where the policy wants
# vendor kernels, else portable (ops/int4/seam.py).
WNA16_MM = Family("weight-only int linear", None)
FAMILIES = (SAMPLING, INT8_MM, GDN, MOE, CUSTOM_OPS, ATTENTION, LORA, MLA, WNA16_MM)


@dataclass(frozen=True)
class Choice(Generic[T]):
    """The path one family takes for one op on one device, why, and the vendor handle."""

    name: str
    reason: str
    vendor: T | None = None


def vendor_policy() -> tuple[bool, str]:
    """Whether the active vLLM platform routes work to vendor kernels, and why: the
    platform's own ``vendor_kernels()`` (Kunlun: yes; host emulation: only with
    ``VLLM_KUNLUN_EMULATION_VENDOR=1``)."""
    platform = active_plugin_platform()
    if platform is None:
        return False, "the active vLLM platform is not a vllm-kunlun platform"
    return platform.vendor_kernels()  # type: ignore[no-any-return]


def platform_device_type() -> str | None:
    """The device type the active vllm-kunlun platform runs models on (None: not ours)."""
    platform = active_plugin_platform()
    return None if platform is None else str(platform.device_type)


def mode_of(family: Family) -> str:
    """The family's switch as validated by ``envs`` (``auto`` when it has none)."""
    return AUTO if family.variable is None else str(getattr(envs, family.variable))


def choose(
    family: Family,
    device: torch.device | None,
    *,
    vendor: Loader[T] | None,
    native: NativeKernel | None = None,
    triton: Probe | None = None,
    op: str = "",
) -> Choice[T]:
    """The path for ``op`` of ``family`` on ``device`` (None: the platform's own
    device, for layers chosen before any tensor exists). ``vendor`` loads the vendor
    handle (None: no vendor kernel is wired for the op); ``native`` and ``triton``
    probe those paths where the family has them."""
    named = op and op != family.label
    what = f"{family.label} kernel {op}" if named else f"{family.label} kernels"
    mode = mode_of(family)
    if mode == AUTO:
        choice = _auto(family, device, vendor, native, triton, op, what)
    else:
        choice = _demanded(family, mode, device, vendor, native, triton, op)
    where = "the platform's device" if device is None else device.type
    logger.info_once(
        "vllm-kunlun: %s on %s: %s (%s)",
        what,
        where,
        choice.name,
        choice.reason,
    )
    return choice


def _demanded(
    family: Family,
    mode: str,
    device: torch.device | None,
    vendor: Loader[T] | None,
    native: NativeKernel | None,
    triton: Probe | None,
    op: str,
) -> Choice[T]:
    var = f"{family.variable}={mode}"
    if mode == PORTABLE:
        return Choice(PORTABLE, var)
    if mode == VENDOR:
        if vendor is None:
            return Choice(
                PORTABLE, f"{var}; no vendor kernel is wired for {op or family.label}"
            )
        handle, why = vendor()
        if handle is None:
            raise RuntimeError(
                f"{var}, but {why}. {family.vendor_fix}, or set "
                f"{family.variable}=auto to use the portable torch kernels."
            )
        return Choice(VENDOR, f"{var}; {why}", handle)
    if mode == NATIVE and native is not None:
        if device is None or device.type != "cpu":
            raise RuntimeError(
                f"{var} runs on the CPU, but {family.subject} are on {device}; set "
                f"{family.variable}=auto."
            )
        ok, why = native.available()
        if not ok:
            raise RuntimeError(
                f"{var}, but {why}; or set {family.variable}=auto to use the "
                "portable torch kernels."
            )
        return Choice(NATIVE, f"{var}; {why}")
    if mode == TRITON and triton is not None:
        ok, why = triton()
        if not ok:
            raise RuntimeError(
                f"{var}, but {why}. Set {family.variable}=auto (portable torch "
                "kernels are used where Triton cannot run)."
            )
        return Choice(TRITON, var)
    raise ValueError(f"{var}: {family.label} has no {mode} path")  # envs validates


def _auto(
    family: Family,
    device: torch.device | None,
    vendor: Loader[T] | None,
    native: NativeKernel | None,
    triton: Probe | None,
    op: str,
    what: str,
) -> Choice[T]:
    passed: list[str] = []  # why each earlier path was not taken
    platform_type = platform_device_type()
    on_cpu = device is not None and device.type == "cpu"
    wanted, policy_why = vendor_policy()
    if on_cpu and platform_type != "cpu":
        passed.append(f"{family.subject} are on the CPU")
    elif not wanted:
        passed.append(policy_why)
    elif vendor is None:
        passed.append(f"no vendor kernel is wired for {op or family.label}")
    elif device is not None and device.type != platform_type:
        passed.append(
            f"{family.subject} are on {device.type}, the platform runs on {platform_type}"
        )
    else:
        handle, why = vendor()
        if handle is not None:
            return Choice(VENDOR, why, handle)
        if not family.caller_warns:
            logger.warning_once(
                "vllm-kunlun: %s on %s use portable paths, not the vendor kernels: %s",
                what,
                device.type if device is not None else "the platform's device",
                why,
            )
        passed.append(why)
    if native is not None and on_cpu:
        ok, why = native.preferred()
        if ok:
            return Choice(NATIVE, "; ".join([*passed, why]))
        passed.append(why)
    if triton is not None and not on_cpu:
        ok, why = triton()
        if ok:
            return Choice(TRITON, "; ".join([why, *passed]))
        passed.append(why)
    return Choice(PORTABLE, "; ".join(passed))


class DeviceSeam(Generic[T, K]):
    """A family seam's state, the same for every family that picks once per device:
    the kernels chosen for each device (``choose`` runs, and logs, once per device;
    ``make`` turns the choice into the family's kernels object) and the calls each
    path served (``record``; ``served`` is what the demo's report and the tests read).
    """

    def __init__(
        self, family: Family, vendor: Loader[T], make: Callable[[Choice[T]], K]
    ) -> None:
        self.family, self.vendor, self.make = family, vendor, make
        self._selected: dict[torch.device, K] = {}
        self._served: Counter[tuple[str, str, str]] = Counter()

    def select(self, device: torch.device | str) -> K:
        device = torch.device(device)
        if device not in self._selected:
            choice = choose(self.family, device, vendor=self.vendor)
            self._selected[device] = self.make(choice)
        return self._selected[device]

    def record(self, device: torch.device, path: str, reason: str) -> None:
        self._served[(device.type, path, reason)] += 1

    def served(self) -> list[dict[str, Any]]:
        return [
            {"device": device, "path": path, "reason": reason, "calls": calls}
            for (device, path, reason), calls in sorted(self._served.items())
        ]

    def reset(self) -> None:
        """Forget the per-device choices and the call counts (tests)."""
        self._selected.clear()
        self._served.clear()
