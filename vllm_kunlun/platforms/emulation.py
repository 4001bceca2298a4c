"""KunlunHostEmulationPlatform: the plugin's code paths on the host CPU.

Why: there is no Kunlun card in CI or on a developer laptop, yet the plugin's engine
integration (platform hooks, runtime fixes, the sampler patch, the engine-start guards,
the portable attention backend) must be proven on every change. This platform runs
vLLM's V1 engine on the CPU through the same out-of-tree plugin route as KunlunPlatform,
without ``vllm._C`` (which cannot load on torch 2.5.1).

It is activated only by ``VLLM_KUNLUN_HOST_EMULATION=1`` and says so loudly: it is not a
Kunlun device and its speed means nothing for one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from vllm.v1.attention.backends.registry import AttentionBackendEnum

from vllm_kunlun import envs
from vllm_kunlun.logger import init_logger
from vllm_kunlun.platforms.kunlun import KunlunPlatformBase

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

# Backends vLLM offers that cannot run here, and why.
_EMULATION_REFUSED_ATTN_BACKENDS = {
    AttentionBackendEnum.CPU_ATTN: "needs vllm._C CPU kernels, which do not load on "
    "torch 2.5.1",
    AttentionBackendEnum.TRITON_ATTN: "needs a GPU for its Triton kernels",
    AttentionBackendEnum.FLEX_ATTENTION: "is not validated in host emulation",
}


class KunlunHostEmulationPlatform(KunlunPlatformBase):
    _banner = (
        "HOST EMULATION active (VLLM_KUNLUN_HOST_EMULATION=1): the plugin runs on the "
        "host CPU; this is NOT a Kunlun device and its speed says nothing about one"
    )
    device_name: str = "cpu"
    device_type: str = "cpu"
    dispatch_key: str = "CPU"
    # Ray: one emulated card per worker as a "GPU" resource, as on Kunlun. Not "CPU":
    # vLLM's Ray worker reads its ids from Ray's accelerator table (no "CPU" there),
    # and a 2-core host has fewer CPUs than workers plus Ray's own.
    ray_device_key: str = "GPU"
    dist_backend: str = "gloo"
    device_control_env_var: str = "CPU_VISIBLE_MEMORY_NODES"
    _dtype_refusal = (
        "Host emulation does not run models in {dtype}; use --dtype float32"
    )
    _pg_backends = ("gloo",)
    _attn_where = "in vllm-kunlun host emulation"
    _attn_default = AttentionBackendEnum.CUSTOM
    _attn_allowed = (AttentionBackendEnum.CUSTOM,)
    _attn_refused = _EMULATION_REFUSED_ATTN_BACKENDS
    additional_env_vars: list[str] = [*envs.registry()]

    @classmethod
    def vendor_kernels(cls) -> tuple[bool, str]:
        if envs.VLLM_KUNLUN_EMULATION_VENDOR:
            return True, "VLLM_KUNLUN_EMULATION_VENDOR=1"
        return False, (
            "host emulation takes the portable paths (VLLM_KUNLUN_EMULATION_VENDOR=1 "
            "takes the vendor ones)"
        )

    # ---- device ---------------------------------------------------------------------
    @classmethod
    def device_count(cls) -> int:
        return 1

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "vllm-kunlun host emulation (cpu)"

    @classmethod
    def get_device_uuid(cls, device_id: int = 0) -> str:
        return f"KUNLUN-EMULATION-{device_id}"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        # The KV cache budget, not the host RAM (vLLM's CPU default is half of it).
        return int(envs.VLLM_KUNLUN_EMULATION_KV_CACHE_GIB * (1 << 30))

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        return None

    # No inference_mode() override (vLLM's CPU platform returns no_grad there): vLLM
    # 0.15.1 never calls it, its workers hard-code torch.inference_mode(), as on
    # Kunlun. What gloo needs under inference mode is in communicator.py.

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    # ---- configuration (KunlunPlatformBase.check_and_update_config) -----------------
    # The emulation defaults first, then the same defaults and engine-start guards as on
    # Kunlun. Not the device-memory budget: the emulated KV cache is a fixed size
    # (VLLM_KUNLUN_EMULATION_KV_CACHE_GIB) and there is no device to fill.
    _budget_guard = False

    @classmethod
    def ray_host_cards(cls, vllm_config: VllmConfig) -> int:
        # Every worker's emulated card, on the host a local Ray starts on.
        return int(vllm_config.parallel_config.world_size)

    @classmethod
    def _defaults_first(cls, vllm_config: VllmConfig) -> None:
        from vllm_kunlun.platforms.emulation_defaults import apply_emulation_defaults

        apply_emulation_defaults(vllm_config)
