"""vLLM's CustomOps on Kunlun's vendor kernels, through vLLM's out-of-tree mechanism.

Why: on vLLM 0.15.1 an out-of-tree platform runs every CustomOp's ``forward_native``
(one small torch kernel per step of the formula); the vendor library has one fused
kernel for each of RMSNorm (+ residual add), Gemma RMSNorm, gated RMSNorm, rotary
embedding / M-RoPE and SiLU-and-mul.

How: ``CustomOp.register_oot`` files a subclass under the upstream class name, and
``CustomOp.__new__`` builds it whenever a model asks for the upstream class; on an
out-of-tree platform an enabled op dispatches to ``forward_oot``. No vLLM file or
attribute is changed. ``register_all()`` runs with the runtime fixes in every process
once vLLM's platform is resolved, and only when the platform wants vendor kernels
(KunlunPlatform; host emulation with ``VLLM_KUNLUN_EMULATION_VENDOR=1``). Each
replacement keeps vLLM's op name (``rms_norm``, ``rotary_embedding``, ...), so
``compilation_config.custom_ops`` switches it exactly as it switches vLLM's own: with
torch.compile + Inductor vLLM turns custom ops off ("none") and the replaced ops run
their native path inside the compiled graph (``log_enablement`` says so once).

Removal: when vLLM ships Kunlun kernels for these ops.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_kunlun.logger import init_logger
from vllm_kunlun.ops import chooser

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)


@dataclass(frozen=True)
class Replacement:
    vllm_module: str
    vllm_class: str
    module: str  # ours, relative to this package
    cls: str

    def upstream(self) -> Any:
        return getattr(importlib.import_module(self.vllm_module), self.vllm_class)

    def ours(self) -> Any:
        return getattr(importlib.import_module(f"{__name__}.{self.module}"), self.cls)


_LAYERS = "vllm.model_executor.layers"
REPLACEMENTS: tuple[Replacement, ...] = (
    Replacement(f"{_LAYERS}.layernorm", "RMSNorm", "norms", "KunlunRMSNorm"),
    Replacement(f"{_LAYERS}.layernorm", "GemmaRMSNorm", "norms", "KunlunGemmaRMSNorm"),
    Replacement(f"{_LAYERS}.layernorm", "RMSNormGated", "norms", "KunlunRMSNormGated"),
    Replacement(
        f"{_LAYERS}.rotary_embedding.base",
        "RotaryEmbedding",
        "rotary",
        "KunlunRotaryEmbedding",
    ),
    Replacement(
        f"{_LAYERS}.rotary_embedding.mrope",
        "MRotaryEmbedding",
        "rotary",
        "KunlunMRotaryEmbedding",
    ),
    Replacement(
        f"{_LAYERS}.activation", "SiluAndMul", "activation", "KunlunSiluAndMul"
    ),
)
# vLLM's op names of the replaced classes (what ``custom_ops`` flags name).
OP_NAMES = (
    "rms_norm",
    "gemma_rms_norm",
    "rms_norm_gated",
    "rotary_embedding",
    "silu_and_mul",
)


def register_all(policy: tuple[bool, str] | None = None) -> list[str]:
    """Register every replacement not yet registered; returns the names registered now.

    Deferred (returns []) while vLLM is still resolving its platform; a no-op unless the
    platform wants vendor kernels. A class someone else already replaced is kept, with a
    warning naming it.
    """
    from vllm_kunlun.patching.attribute import platform_resolved

    if not platform_resolved():
        return []
    wanted, why = chooser.vendor_policy() if policy is None else policy
    if not wanted:
        logger.debug("vllm-kunlun: vLLM's CustomOps stay as they are: %s", why)
        return []
    from vllm.model_executor.custom_op import CustomOp, op_registry_oot

    done = []
    for r in REPLACEMENTS:
        ours, current = r.ours(), op_registry_oot.get(r.vllm_class)
        if current is ours:
            continue
        if current is not None:
            logger.warning_once(
                "vllm-kunlun: %s is already replaced by %s.%s; keeping it (the vendor "
                "kernel version is %s)",
                r.vllm_class,
                current.__module__,
                current.__qualname__,
                r.cls,
            )
            continue
        CustomOp.register_oot(ours, name=r.vllm_class)
        # register_oot names the op after the class; vLLM's op name keeps the
        # custom_ops switches (+rms_norm, -silu_and_mul, ...) meaning what they say.
        ours.name = r.upstream().name
        done.append(r.vllm_class)
    if done:
        logger.info(
            "vllm-kunlun: CustomOps replaced for the vendor kernels (%s): %s",
            why,
            ", ".join(done),
        )
    return done


RUNTIME_PATCHES = {"kunlun_vendor_custom_ops": lambda phase: bool(register_all())}


def registered() -> list[str]:
    from vllm.model_executor.custom_op import op_registry_oot

    return [
        r.vllm_class
        for r in REPLACEMENTS
        if op_registry_oot.get(r.vllm_class) is r.ours()
    ]


def unregister_all() -> None:
    """Undo ``register_all`` (tests); someone else's replacements stay."""
    from vllm.model_executor.custom_op import op_registry_oot

    for name in registered():
        del op_registry_oot[name]


def enable_flags() -> list[str]:
    """``custom_ops`` entries that turn every replaced op on."""
    return [f"+{name}" for name in OP_NAMES]


def log_enablement(vllm_config: VllmConfig) -> None:
    """Say once which replaced ops this engine configuration leaves on the native path."""
    cc = vllm_config.compilation_config
    off = [name for name in OP_NAMES if not cc.is_custom_op_enabled(name)]
    if off:
        logger.info_once(
            "vllm-kunlun: %s run vLLM's native torch code, not the vendor kernels: "
            "compilation_config.custom_ops=%s (vLLM turns custom ops off under "
            "torch.compile with Inductor, which then compiles the native code). For "
            "the vendor kernels serve with --enforce-eager",
            ", ".join(off),
            str(cc.custom_ops),  # *_once caches on its arguments: hashable only
        )


def describe_model(model: Any) -> dict[str, dict[str, Any]]:
    """The replaced CustomOps in ``model``: per class, how many and which forward runs."""
    out: dict[str, dict[str, Any]] = {}
    ours = {r.ours() for r in REPLACEMENTS}
    for module in model.modules():
        cls = type(module)
        if cls not in ours:
            continue
        entry = out.setdefault(
            f"{cls.__module__}.{cls.__qualname__}", {"modules": 0, "forward": set()}
        )
        entry["modules"] += 1
        method = getattr(module, "_forward_method", None)
        entry["forward"].add(getattr(method, "__name__", repr(method)))
    return {
        name: {"modules": e["modules"], "forward": sorted(e["forward"])}
        for name, e in out.items()
    }
