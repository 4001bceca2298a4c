"""The doctor's ``sampler_path`` check: which sampling implementation the active platform uses, and a probe that
the sampler's noise is generated on the sampler's device.

The deployment's decode stall: vLLM's native sampler drew its noise with
``Tensor.exponential_``, which has no Kunlun device kernel and silently ran on the CPU
(4.89 s per 256 x 152K step, device idle). On a vllm-kunlun platform the runtime patch
``kunlun_topk_topp_sampler`` puts ``KunlunTopKTopPSampler`` into vLLM; its kernels are
chosen by ``ops.sampling.select_kernels`` (vendor ``kunlun_ops`` kernel or the portable
torch one). The probe runs that sampler and the spec-decode noise helper on the device
vLLM would use (``torch.cuda`` device 0, else the CPU, said so) and records:
the devices of the tokens and of the noise, every ``Tensor.exponential_`` call (a counting
wrapper installed for the probe only, then removed), and, on a device, every host
synchronisation (``torch.cuda.set_sync_debug_mode("error")``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_kunlun.checks.finding import Context, Finding
from vllm_kunlun.hardware.device import probe_devices
from vllm_kunlun.versions import install_hint, label

PROBE_BATCH = 8
PROBE_VOCAB = 4096


@dataclass
class ProbeResult:
    device: str
    device_note: str
    exponential_calls: int = 0
    host_sync_checked: bool = False
    problems: list[str] = field(default_factory=list)


def probe_device() -> tuple[torch.device, str]:
    if torch.cuda.is_available():
        return torch.device("cuda", 0), "torch.cuda device 0"
    return torch.device("cpu"), (
        "no accelerator visible: probe ran on the CPU (device placement checked; host "
        "round trips are only measurable on a device)"
    )


@contextlib.contextmanager
def count_exponential() -> Iterator[list[int]]:
    """Count ``Tensor.exponential_`` calls while the probe runs (restored after)."""
    original = torch.Tensor.exponential_
    calls = [0]

    def counting(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls[0] += 1
        return original(self, *args, **kwargs)

    torch.Tensor.exponential_ = counting  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        torch.Tensor.exponential_ = original  # type: ignore[method-assign]


@contextlib.contextmanager
def no_host_sync(device: torch.device) -> Iterator[bool]:
    """On a device: raise on any host synchronisation inside the block."""
    if device.type != "cuda":
        yield False
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield True
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def run_probe(sampler: Any, device: torch.device, device_note: str) -> ProbeResult:
    """Sample with ``sampler`` (vLLM's TopKTopPSampler call signature) and draw
    spec-decode noise on ``device``; no host round trip, no ``exponential_``."""
    from vllm_kunlun.ops.sampling.noise import exponential_noise

    result = ProbeResult(str(device), device_note)
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    logits = torch.randn(PROBE_BATCH, PROBE_VOCAB, device=device)
    top_k = torch.full((PROBE_BATCH,), 50, dtype=torch.int64, device=device)
    top_p = torch.full((PROBE_BATCH,), 0.9, dtype=torch.float32, device=device)
    outputs: dict[str, torch.Tensor] = {}
    with count_exponential() as calls, no_host_sync(device) as checked:
        result.host_sync_checked = checked
        try:
            outputs["tokens (no filters)"] = sampler(logits.clone(), {}, None, None)[0]
            outputs["tokens (top-k/top-p)"] = sampler(logits.clone(), {}, top_k, top_p)[
                0
            ]
            outputs["tokens (seeded request)"] = sampler(
                logits.clone(), {0: gen}, None, None
            )[0]
            outputs["spec-decode noise"] = exponential_noise(
                PROBE_BATCH, PROBE_VOCAB, {}, device
            )
        except RuntimeError as exc:
            if checked and "synchroniz" in str(exc):
                result.problems.append(f"host round trip during sampling: {exc}")
            else:
                raise
    result.exponential_calls = calls[0]
    if calls[0]:
        result.problems.append(
            f"Tensor.exponential_ called {calls[0]} time(s): on Kunlun it has no device "
            "kernel and runs on the CPU (the log's decode stall)"
        )
    for what, tensor in outputs.items():
        if tensor.device != device:
            result.problems.append(f"{what} on {tensor.device}, not {device}")
    noise = outputs.get("spec-decode noise")
    if noise is not None and not bool(
        torch.isfinite(noise).all() and (noise > 0).all()
    ):
        result.problems.append("spec-decode noise is not finite and positive")
    return result


def worker_sampler(ours: bool) -> tuple[type | None, str, str | None]:
    """The top-k/top-p sampler class a model runner in this environment would build,
    how we know, and the fix when the plugin list vLLM loads is why it is not ours:
    first that list, then the worker the platform selects, which prepares its process
    (runtime fixes) before building the model."""
    import vllm.envs
    from vllm.platforms import current_platform

    from vllm_kunlun.doctor.plugins import PLATFORM_GROUP, our_entry_points

    plugins = vllm.envs.VLLM_PLUGINS
    platform_plugins = [n for n, g in our_entry_points().items() if g == PLATFORM_GROUP]
    if plugins is not None and not set(platform_plugins) & set(plugins):
        allowed = ",".join(dict.fromkeys([*plugins, *platform_plugins]))
        return (
            None,
            f"VLLM_PLUGINS={','.join(plugins)} leaves out the platform plugin "
            f"{', '.join(map(repr, platform_plugins))}: vLLM never activates a "
            "vllm-kunlun platform",
            f"export VLLM_PLUGINS={allowed} (or unset VLLM_PLUGINS)",
        )
    if not ours:
        return None, "no vllm-kunlun platform is active in this environment", None
    from vllm.v1.sample.sampler import Sampler

    from vllm_kunlun.platforms import emulation_defaults, kunlun_defaults
    from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform
    from vllm_kunlun.platforms.runtime_fixes import prepare_model_process

    emulated = isinstance(current_platform, KunlunHostEmulationPlatform)
    worker = (emulation_defaults if emulated else kunlun_defaults).WORKER_CLS
    prepare_model_process()  # what KunlunWorker / EmulationWorker run first
    return type(Sampler().topk_topp_sampler), f"{worker} prepares its process", None


def _platform() -> tuple[str, bool]:
    from vllm.platforms import current_platform

    from vllm_kunlun.platforms.kunlun import KunlunPlatformBase

    return type(current_platform).__name__, isinstance(
        current_platform, KunlunPlatformBase
    )


def check_sampler_path(ctx: Context) -> Finding:
    from vllm_kunlun.checks.vllm_import import ensure_vllm_importable

    ensure_vllm_importable()
    from vllm_kunlun.ops import chooser
    from vllm_kunlun.ops.sampling.sampler_patches import PATCHES
    from vllm_kunlun.ops.sampling.seam import select_kernels
    from vllm_kunlun.ops.sampling.topk_topp import KunlunTopKTopPSampler

    platform, ours = _platform()
    device, note = probe_device()
    built, how, plugins_fix = worker_sampler(ours)
    details: dict[str, Any] = {
        "platform": platform,
        "kunlun_platform": ours,
        "VLLM_KUNLUN_SAMPLER": chooser.mode_of(chooser.SAMPLING),
        "worker_sampler": None if built is None else built.__name__,
        "worker_sampler_source": how,
    }
    if plugins_fix is not None:
        return Finding(
            "sampler_path",
            "fail" if probe_devices().count > 0 else "warn",
            f"{how}; the workers would run vLLM's own sampler "
            "(TopKTopPSampler.forward_native: Tensor.exponential_ on the CPU on Kunlun)",
            plugins_fix,
            details,
        )
    if built is not None and built is not KunlunTopKTopPSampler:
        return Finding(
            "sampler_path",
            "fail",
            f"{how}, yet its model runner would build {built.__module__}."
            f"{built.__qualname__}, not KunlunTopKTopPSampler: decode would draw "
            "Tensor.exponential_ noise on the CPU",
            install_hint("vllm") + " (the validated version); `vllm-kunlun patch "
            "status` lists the runtime patches and their states",
            details,
        )
    mismatches = {p.name: p.mismatch() for p in PATCHES}
    details["patches"] = {
        name: ("applies" if m is None else f"does not apply: {m}")
        for name, m in mismatches.items()
    }
    try:
        kernels = select_kernels(device)
    except RuntimeError as exc:  # VLLM_KUNLUN_SAMPLER=vendor without the vendor op
        return Finding(
            "sampler_path", "fail", str(exc).split(". ")[0], str(exc), details
        )
    details["kernels"] = {"name": kernels.name, "reason": kernels.reason}
    probe = run_probe(KunlunTopKTopPSampler(), device, note)
    details["probe"] = {
        "device": probe.device,
        "note": probe.device_note,
        "exponential_calls": probe.exponential_calls,
        "host_sync_checked": probe.host_sync_checked,
        "problems": probe.problems,
    }
    what = f"KunlunTopKTopPSampler, {kernels.name} kernels ({kernels.reason})"
    if built is not None:
        what = f"{how}; its model runner builds {what}"
    if not ours:
        what = (
            f"{platform} is not a vllm-kunlun platform, so vLLM keeps its own sampler "
            f"here; on Kunlun: {what}"
        )
    broken_patch = mismatches["kunlun_topk_topp_sampler"]
    if broken_patch is not None:
        return Finding(
            "sampler_path",
            "fail",
            f"the sampler patch does not fit this vLLM ({broken_patch}): vLLM's own "
            "sampler would draw Tensor.exponential_ noise on the CPU",
            install_hint("vllm") + " (the validated version)",
            details,
        )
    if probe.problems:
        return Finding(
            "sampler_path",
            "fail",
            f"{what}; probe on {probe.device}: " + "; ".join(probe.problems),
            "report this as a vllm-kunlun bug; meanwhile VLLM_KUNLUN_SAMPLER=portable "
            "is the device-side fallback",
            details,
        )
    sync = ", no host sync" if probe.host_sync_checked else ""
    cause = (
        f"{what}; probe on {probe.device}: tokens and noise stay on {probe.device}, "
        f"0 exponential_ calls{sync}"
    )
    if device.type == "cpu":
        cause += " (CPU probe: no accelerator visible)"
    if ours and device.type != "cpu" and kernels.name != "vendor":
        return Finding(
            "sampler_path",
            "warn",
            cause,
            "install the vendor op library of the validated stack "
            f"({label('kunlun_ops')}) for the vendor sampling kernel",
            details,
        )
    return Finding("sampler_path", "ok", cause, details=details)
