"""Every ``VLLM_KUNLUN_*`` environment variable the package reads.

One registry, so that the README, the doctor and the tests agree on names, types and
defaults. Values are read at attribute access (never at import), so a variable set by a
launcher after ``import vllm_kunlun`` still counts. A malformed value raises ``ValueError``
naming the variable, the value and what is accepted: a typo must not silently mean
"default".

This module must stay importable without torch or vLLM: ``setup.py`` loads it by path.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class EnvVar:
    name: str
    parse: Callable[[str, str], Any]
    default: Any
    doc: str
    accepted: str


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"{name}={raw!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off "
        f"(or unset {name} for its default)"
    )


def _parse_optional_bool(name: str, raw: str) -> bool | None:
    if raw.strip().lower() in ("", "auto"):
        return None
    return _parse_bool(name, raw)


def _choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ValueError(
                f"{name}={raw!r} is not valid; use one of: {', '.join(choices)}"
            )
        return value

    return parse


def _positive_float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValueError(f"{name}={raw!r} must be a positive number")
    return value


def _optional_path(name: str, raw: str) -> str | None:
    return raw.strip() or None


_VARS: dict[str, EnvVar] = {
    v.name: v
    for v in (
        EnvVar(
            "VLLM_KUNLUN_FORCE_PLATFORM",
            _parse_bool,
            False,
            "Activate KunlunPlatform even when no Kunlun device is detected (for images "
            "built or configured on hosts without cards). Device queries still go to "
            "torch.cuda at run time.",
            "1/0",
        ),
        EnvVar(
            "VLLM_KUNLUN_HOST_EMULATION",
            _parse_bool,
            False,
            "Run the plugin's code paths on the host CPU through a separate emulation "
            "platform (tests, CI, demos). Never enabled automatically.",
            "1/0",
        ),
        EnvVar(
            "VLLM_KUNLUN_EMULATION_KV_CACHE_GIB",
            _positive_float,
            1.0,
            "KV cache size in GiB in host emulation (vLLM's CPU default is half the RAM).",
            "a positive number",
        ),
        EnvVar(
            "VLLM_KUNLUN_BUILD_EXT",
            _parse_bool,
            True,
            "Build the native extension (csrc/) at install time; 0 skips it.",
            "1/0",
        ),
        EnvVar(
            "VLLM_KUNLUN_SCHEMA_FIX",
            _parse_bool,
            True,
            "Let torch < 2.6 infer custom-op schemas from list[int] / X | None "
            "annotations when the Kunlun platform is active.",
            "1/0",
        ),
        EnvVar(
            "VLLM_KUNLUN_SAMPLER",
            _choice("auto", "vendor", "portable"),
            "auto",
            "Sampling kernels: auto (vendor when importable, else portable torch), "
            "vendor (fail if the vendor op library is missing), portable.",
            "auto, vendor, portable",
        ),
        EnvVar(
            "VLLM_KUNLUN_GDN",
            _choice("auto", "vendor", "triton", "portable"),
            "auto",
            "Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention) kernels: auto "
            "(vendor where kunlun_ops has the kernel and the tensors are on a device, "
            "else vLLM's Triton kernels when Triton has an active driver, else "
            "portable torch), vendor (fail if missing), triton, portable.",
            "auto, vendor, triton, portable",
        ),
        EnvVar(
            "VLLM_KUNLUN_TP_SAMPLE_BROADCAST",
            _parse_optional_bool,
            None,
            "Sample on TP rank 0 and broadcast the token ids to the TP group, so every "
            "rank emits the same tokens even if device RNGs differ. Default: on when "
            "tensor parallel size > 1.",
            "auto, 1/0",
        ),
        EnvVar(
            "VLLM_KUNLUN_PATCH_DIR",
            _optional_path,
            None,
            "Directory of the patch_torch251 file patch set used by `vllm-kunlun "
            "patch` (default: patches/vllm-0.15.1-torch-2.5.1 of the source checkout).",
            "a directory path",
        ),
    )
}


def registry() -> dict[str, EnvVar]:
    """All variables, for the README table, the doctor and the tests."""
    return dict(_VARS)


def read(name: str) -> Any:
    var = _VARS[name]
    raw = os.environ.get(name)
    if raw is None:
        return var.default
    return var.parse(name, raw)


def __getattr__(name: str) -> Any:
    if name in _VARS:
        return read(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_VARS))


if TYPE_CHECKING:  # names for type checkers; values come from __getattr__
    VLLM_KUNLUN_FORCE_PLATFORM: bool
    VLLM_KUNLUN_HOST_EMULATION: bool
    VLLM_KUNLUN_EMULATION_KV_CACHE_GIB: float
    VLLM_KUNLUN_BUILD_EXT: bool
    VLLM_KUNLUN_SCHEMA_FIX: bool
    VLLM_KUNLUN_SAMPLER: str
    VLLM_KUNLUN_GDN: str
    VLLM_KUNLUN_TP_SAMPLE_BROADCAST: bool | None
    VLLM_KUNLUN_PATCH_DIR: str | None
