"""Every ``VLLM_KUNLUN_*`` environment variable the package reads.

One registry, so that the README, the doctor and the tests agree on names, types and
defaults. Values are read at attribute access (never at import), so a variable set by a
launcher after ``import vllm_kunlun`` still counts. A malformed value raises
``EnvVarError`` naming the variable, the value and what is accepted: a typo must not
silently mean "default". ``validate_all()`` checks every variable at once; the platforms
call it when they start, in every process.

This module must stay importable without torch or vLLM: ``setup.py`` loads it by path.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
PREFIX = "VLLM_KUNLUN_"


class EnvVarError(ValueError):
    """A ``VLLM_KUNLUN_*`` variable with a value its parser refuses."""


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
    raise EnvVarError(
        f"{name}={raw!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off "
        f"(or unset {name} for its default)"
    )


def _choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise EnvVarError(
                f"{name}={raw!r} is not valid; use one of: {', '.join(choices)}"
            )
        return value

    return parse


def _bounded_float(
    upper: float, lower: float = 0.0, lower_why: str = ""
) -> Callable[[str, str], float]:
    """A finite number in (0, upper], and at least ``lower`` when given: ``inf`` or
    ``1e400`` would end as a bare OverflowError wherever the value is turned into
    bytes, and ``1e-320`` as 0 bytes and an error about something else."""

    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 < value <= upper and value >= lower):
            floor = f" and at least {lower} ({lower_why})" if lower else ""
            raise EnvVarError(
                f"{name}={raw!r} must be a positive number no larger than {upper:g}"
                f"{floor}; set it to such a number (or unset {name} for its default)"
            )
        return value

    return parse


def _optional_count(upper: int) -> Callable[[str, str], int | None]:
    """A whole number in [1, upper], or empty for the default."""

    def parse(name: str, raw: str) -> int | None:
        text = raw.strip()
        if not text:
            return None
        try:
            value = int(text)
        except ValueError:
            value = 0
        if not 1 <= value <= upper:
            raise EnvVarError(
                f"{name}={raw!r} must be a whole number from 1 to {upper}; set it to "
                f"such a number (or unset {name} for its default)"
            )
        return value

    return parse


def _optional_dir(name: str, raw: str) -> str | None:
    path = raw.strip()
    if path and not os.path.isdir(path):
        raise EnvVarError(
            f"{name}={raw!r} is not an existing directory; point it at one (or unset "
            f"{name} for its default)"
        )
    return path or None


# Ten minutes: longer than any engine takes to stop; a larger value is a typo.
SHUTDOWN_TIMEOUT_MAX = 600.0
RAY_PG_TIMEOUT_MAX = 3600.0
# Far above any host this emulation runs on; a larger value is a typo.
EMULATION_KV_CACHE_GIB_MAX = 1024.0
# 64 Ki siblings of one request: far above any engine's max_num_seqs; more is a typo
# that brings back the unbounded fan-out the limit exists for.
MAX_N_UPPER = 65536
# One media item larger than this is a typo for the API server's memory (16 GiB).
MAX_MEDIA_MIB_UPPER = 16384.0
# vLLM 0.15.1 builds its speculative token tree in O(N^2) in the API server before any
# engine starts; no released drafter proposes more than a few tokens a step.
MAX_SPEC_TOKENS_UPPER = 64
# 1 MiB: one 16-token block of every attention layer of the deployment log's 27B model (docs/deployment-log.md)
# (16 layers x 16 tokens x 4 KV heads x 256 x K and V x 2 bytes). Less is no cache
# worth serving, and a value like 1e-320 rounds to 0 bytes, which vLLM then reports as
# a --gpu-memory-utilization problem.
EMULATION_KV_CACHE_GIB_MIN = 1 / 1024

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
            "VLLM_KUNLUN_EMULATION_VENDOR",
            _parse_bool,
            False,
            "In host emulation, take the vendor-kernel paths (Kunlun attention "
            "backend, vendor CustomOps, sampler, int8 linear, GDN) whenever the vendor "
            "modules import, e.g. the test fakes; implies host emulation for `vllm-kunlun "
            "demo`.",
            "1/0",
        ),
        EnvVar(
            "VLLM_KUNLUN_EMULATION_KV_CACHE_GIB",
            _bounded_float(
                EMULATION_KV_CACHE_GIB_MAX, EMULATION_KV_CACHE_GIB_MIN, "1 MiB"
            ),
            1.0,
            "KV cache size in GiB in host emulation (vLLM's CPU default is half the "
            "RAM); at least 1 MiB (0.0009765625): less rounds toward 0 bytes.",
            f"a number in [{EMULATION_KV_CACHE_GIB_MIN}, "
            f"{EMULATION_KV_CACHE_GIB_MAX:g}]",
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
            "annotations (applied whenever torch < 2.6 is installed, device or not: "
            "without it `import vllm.config` fails).",
            "1/0",
        ),
        EnvVar(
            "VLLM_KUNLUN_SAMPLER",
            _choice("auto", "vendor", "native", "portable"),
            "auto",
            "Sampling kernels: auto (the vendor kernel where the active platform wants "
            "vendor kernels and it imports, else portable torch; on the CPU the "
            "plugin's native C++ kernel when built, else portable torch), vendor (fail if the vendor op library is missing), "
            "native (CPU only; fail if the extension lacks it), portable.",
            "auto, vendor, native, portable",
        ),
        EnvVar(
            "VLLM_KUNLUN_INT8_MM",
            _choice("auto", "vendor", "portable"),
            "auto",
            "W8A8 int8 linear kernels: auto (vendor where the active platform wants "
            "vendor kernels and they import, else portable torch), vendor (fail if the vendor ops are missing), "
            "portable.",
            "auto, vendor, portable",
        ),
        EnvVar(
            "VLLM_KUNLUN_GDN",
            _choice("auto", "vendor", "triton", "portable"),
            "auto",
            "Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention) kernels: auto "
            "(vendor where the active platform wants vendor kernels and kunlun_ops has "
            "the kernel, else vLLM's Triton kernels when Triton has an active driver, else "
            "portable torch), vendor (fail if missing), triton, portable.",
            "auto, vendor, triton, portable",
        ),
        EnvVar(
            "VLLM_KUNLUN_TP_SAMPLE_BROADCAST",
            _parse_bool,
            True,
            "Sample on TP rank 0 and broadcast the token ids to the TP group, so every "
            "rank emits the same tokens even if device RNGs differ. Only acts when "
            "tensor parallel size > 1; 0 lets each rank keep its own draw.",
            "1/0",
        ),
        EnvVar(
            "VLLM_KUNLUN_SHUTDOWN_TIMEOUT",
            _bounded_float(
                SHUTDOWN_TIMEOUT_MAX, 1.0, "the engine core needs about 1 s"
            ),
            10.0,
            "Seconds `vllm serve` takes at most to exit after SIGINT / SIGTERM: "
            "in-flight requests fail at once with an error naming the shutdown, open "
            "connections get a fifth of it to read theirs, and whatever process of "
            "the server is still alive at the end is killed (a second Ctrl-C kills "
            "it at once).",
            f"a number in [1, {SHUTDOWN_TIMEOUT_MAX:g}]",
        ),
        EnvVar(
            "VLLM_KUNLUN_RAY_PG_TIMEOUT",
            _bounded_float(RAY_PG_TIMEOUT_MAX, 1.0, "Ray needs about 1 s"),
            60.0,
            "Seconds an engine on vLLM's Ray executor waits for its placement group "
            "(one device bundle per worker) before it fails with an error naming what "
            "it asked, what the cluster has and the fix (vLLM alone waits 1800 s).",
            f"a number in [1, {RAY_PG_TIMEOUT_MAX:g}]",
        ),
        EnvVar(
            "VLLM_KUNLUN_PATCH_DIR",
            _optional_dir,
            None,
            "Directory of the patch_torch251 file patch set used by `vllm-kunlun "
            "patch` (default: patches/vllm-0.15.1-torch-2.5.1 of the source checkout, "
            "else the copy a wheel ships in vllm_kunlun/_patches).",
            "an existing directory",
        ),
        EnvVar(
            "VLLM_KUNLUN_MAX_N",
            _optional_count(MAX_N_UPPER),
            None,
            "The largest `n` (parallel samples) one request may ask for; a larger one "
            "is answered 400 naming the limit. Default: the engine's --max-num-seqs "
            "(more siblings than the engine schedules at once only queue, and each is "
            "a whole request in the API server and the engine core).",
            f"a whole number in [1, {MAX_N_UPPER}]",
        ),
        EnvVar(
            "VLLM_KUNLUN_MAX_MEDIA_MIB",
            _bounded_float(
                MAX_MEDIA_MIB_UPPER, 0.001, "no image is smaller than 1 KiB"
            ),
            256.0,
            "The most MiB the API server reads from one image or video URL; a larger "
            "body is answered 400 naming the limit, and the read stops there (vLLM "
            "alone reads any size into memory within its fetch timeout).",
            f"a number in [0.001, {MAX_MEDIA_MIB_UPPER:g}]",
        ),
        EnvVar(
            "VLLM_KUNLUN_MAX_SPEC_TOKENS",
            _optional_count(MAX_SPEC_TOKENS_UPPER),
            16,
            "The largest num_speculative_tokens an engine accepts; a larger one is "
            "refused at start naming the limit (vLLM alone builds a token tree that "
            "grows with its square in the API server before any engine starts).",
            f"a whole number in [1, {MAX_SPEC_TOKENS_UPPER}]",
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


def problems(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every declared variable whose value does not parse: name -> the refusal."""
    env = os.environ if environ is None else environ
    found = {}
    for name, var in _VARS.items():
        raw = env.get(name)
        if raw is None:
            continue
        try:
            var.parse(name, raw)
        except ValueError as exc:
            found[name] = str(exc)
    return found


def unknown(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """``VLLM_KUNLUN_*`` names nothing declares (typos): name -> the nearest declared
    name, or None."""
    env = os.environ if environ is None else environ
    # Compare what follows the shared prefix, which would make every name look close.
    suffixes = {name.removeprefix(PREFIX): name for name in _VARS}
    found: dict[str, str | None] = {}
    for name in sorted(env):
        if name.startswith(PREFIX) and name not in _VARS:
            near = difflib.get_close_matches(name.removeprefix(PREFIX), suffixes, n=1)
            found[name] = suffixes[near[0]] if near else None
    return found


def validate_all(environ: Mapping[str, str] | None = None) -> None:
    """Refuse every malformed variable at once (``EnvVarError``).

    Called when a platform of ours starts, in every process: a bad value stops the
    engine at start instead of killing it at the first request that reads it.
    """
    found = problems(environ)
    if found:
        lines = "\n".join(f"  - {msg}" for msg in found.values())
        raise EnvVarError(
            f"vllm-kunlun: {len(found)} malformed environment variable(s):\n{lines}\n"
            "Set each to an accepted value or unset it (`vllm-kunlun doctor` lists "
            "them too)."
        )


def __getattr__(name: str) -> Any:
    if name in _VARS:
        return read(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_VARS))


if TYPE_CHECKING:  # names for type checkers; values come from __getattr__
    VLLM_KUNLUN_FORCE_PLATFORM: bool
    VLLM_KUNLUN_SHUTDOWN_TIMEOUT: float
    VLLM_KUNLUN_HOST_EMULATION: bool
    VLLM_KUNLUN_EMULATION_VENDOR: bool
    VLLM_KUNLUN_EMULATION_KV_CACHE_GIB: float
    VLLM_KUNLUN_BUILD_EXT: bool
    VLLM_KUNLUN_SCHEMA_FIX: bool
    VLLM_KUNLUN_SAMPLER: str
    VLLM_KUNLUN_INT8_MM: str
    VLLM_KUNLUN_GDN: str
    VLLM_KUNLUN_TP_SAMPLE_BROADCAST: bool
    VLLM_KUNLUN_RAY_PG_TIMEOUT: float
    VLLM_KUNLUN_PATCH_DIR: str | None
    VLLM_KUNLUN_MAX_N: int | None
    VLLM_KUNLUN_MAX_MEDIA_MIB: float
    VLLM_KUNLUN_MAX_SPEC_TOKENS: int | None
