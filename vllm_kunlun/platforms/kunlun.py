"""KunlunPlatform: vLLM's view of a Kunlun P800 host.

Kunlun's torch build runs in CUDA-compatibility mode: the real backend is ``torch.cuda``
(``cuda:0`` tensors, NCCL-compatible collectives), ``torch.xpu`` is an Intel stub that
reports 0 devices, and the device count to trust comes from ``torch_xmlir``. So the
platform speaks ``cuda`` everywhere, yet is out-of-tree (``is_cuda()`` is False) so that
vLLM's NVIDIA-only paths (``vllm._C`` kernels, FlashAttention, custom all-reduce) stay off.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import torch
from vllm.platforms.interface import Platform, PlatformEnum
from vllm.v1.attention.backends.registry import AttentionBackendEnum

from vllm_kunlun import envs
from vllm_kunlun.hardware.device import probe_devices
from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching.phases import Phase, apply_phase

if TYPE_CHECKING:
    from torch.distributed import PrefixStore, ProcessGroup
    from vllm.config import VllmConfig
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.attention.selector import AttentionSelectorConfig

logger = init_logger(__name__)

# Backends that need NVIDIA-only binaries, and why.
_NVIDIA_ONLY_ATTN_BACKENDS = {
    AttentionBackendEnum.FLASH_ATTN: "needs vllm's FlashAttention CUDA binaries",
    AttentionBackendEnum.FLASH_ATTN_DIFFKV: "needs vllm's FlashAttention CUDA binaries",
    AttentionBackendEnum.FLASHINFER: "needs the flashinfer CUDA library",
    AttentionBackendEnum.FLASHINFER_MLA: "needs the flashinfer CUDA library",
    AttentionBackendEnum.FLASHMLA: "needs vllm._C / FlashMLA CUDA binaries",
    AttentionBackendEnum.CUTLASS_MLA: "needs vllm._C CUTLASS kernels",
}

# Vision-encoder backends vLLM 0.15.1 knows besides TORCH_SDPA, and why they cannot run.
_VIT_REFUSED = {
    AttentionBackendEnum.FLASH_ATTN: "needs FlashAttention's varlen CUDA kernels",
    AttentionBackendEnum.ROCM_AITER_FA: "needs ROCm's AITER kernels",
}


def check_environment() -> None:
    """Refuse malformed ``VLLM_KUNLUN_*`` values; warn about names nothing declares."""
    envs.validate_all()
    for name, near in envs.unknown().items():
        logger.warning_once(
            "vllm-kunlun: %s is not a variable of this vllm-kunlun version and is "
            "ignored%s",
            name,
            f" (did you mean {near}?)" if near else "",
        )


class KunlunPlatformBase(Platform):
    """What every vllm-kunlun platform shares: KunlunPlatform and host emulation.

    The runtime fixes go in while vLLM builds the platform object, in every process;
    ``isinstance(current_platform, KunlunPlatformBase)`` is how the plugin tells that
    one of its platforms is active.
    """

    _enum = PlatformEnum.OOT
    is_vllm_kunlun_platform = True  # hardware.MARKER
    _banner: str = "vllm-kunlun platform active"
    # What the platform runs models in, and the words of a refusal.
    _dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)
    _dtype_refusal: str = (
        "Kunlun P800 does not run models in {dtype}; use --dtype bfloat16"
    )
    # Backends of stateless (non-global) process groups.
    _pg_backends: tuple[str, ...] = ("nccl", "gloo")
    # Attention: the default, what an explicit choice may name, why others cannot run.
    _attn_where: str = "on Kunlun"
    _attn_default = AttentionBackendEnum.TRITON_ATTN
    _attn_allowed: tuple[AttentionBackendEnum, ...] = (
        AttentionBackendEnum.TRITON_ATTN,
        AttentionBackendEnum.CUSTOM,
    )
    _attn_refused: dict[AttentionBackendEnum, str] = _NVIDIA_ONLY_ATTN_BACKENDS
    # vLLM's small torch.compile'd helpers (the masked vocab lookup at TP > 1, MoE
    # routing, logprob ranks) run through Dynamo without Inductor: on Kunlun because
    # Inductor's Triton code generation is not validated on torch 2.5.1; in host
    # emulation so that it takes the same path, and no worker compiles C++ with the
    # host's toolchain at its first step (vLLM's default, "inductor").
    simple_compile_backend: str = "eager"

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return list(self._dtypes)

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        if dtype not in cls._dtypes:
            names = " / ".join(str(d).removeprefix("torch.") for d in cls._dtypes)
            raise ValueError(f"{cls._dtype_refusal.format(dtype=dtype)} (or {names}).")

    def __init__(self) -> None:
        # Every VLLM_KUNLUN_* value first, in every process that builds a platform of
        # ours (API server, engine core, workers): a bad value stops it here, not the
        # engine at the first request that reads the variable.
        check_environment()
        # vLLM builds the platform object while it imports its own modules; the schema
        # fix has to be in place before vllm.distributed registers its custom ops.
        apply_phase(Phase.PLATFORM_LOAD)
        logger.info("vllm-kunlun: %s", self._banner)

    @classmethod
    def pre_register_and_update(
        cls, parser: FlexibleArgumentParser | None = None
    ) -> None:
        # Called before vLLM reads --model (CLI parser, top of create_engine_config):
        # the model-path guard must be in place by then (see vllm_kunlun/guards/model_path.py).
        from vllm_kunlun.platforms.runtime_fixes import prepare_front_end

        # ModelConfig resolves the architecture right after this hook.
        prepare_front_end()

    # ---- vendor kernels ---------------------------------------------------------------
    @classmethod
    def vendor_kernels(cls) -> tuple[bool, str]:
        """Whether attention, CustomOps and sampling go to the vendor kernels (where
        the vendor library has them), and why."""
        return True, "KunlunPlatform"

    @classmethod
    def verify_quantization(cls, quant: str) -> None:
        """A quantized model is being configured: refuse a method the platform cannot
        run (vllm_kunlun/ops/int8/schemes.py), register our int8 kernel before
        vLLM builds its W8A8 layers
        (vllm_kunlun/ops/int8/int8_kernel_table_patch.py)."""
        from vllm_kunlun.ops.int8.schemes import refuse_method

        refuse_method(quant, cls._attn_where)
        super().verify_quantization(quant)
        apply_phase(Phase.QUANTIZED_MODEL)

    # ---- attention ------------------------------------------------------------------
    @classmethod
    def get_attn_backend_cls(
        cls,
        selected_backend: AttentionBackendEnum | None,
        attn_selector_config: AttentionSelectorConfig,
    ) -> str:
        """The Kunlun backend on the vendor kernels when the platform wants them and
        they serve the layer; else the platform's default, or an explicit choice it can
        run; else a refusal that says why and what to use. CUSTOM is the plugin's
        portable backend. MLA layers go to the plugin's MLA backend
        (vllm_kunlun/ops/mla/select.py)."""
        if attn_selector_config.use_mla:
            from vllm_kunlun.ops.mla.select import select_mla

            return select_mla(selected_backend, attn_selector_config, cls._attn_where)
        if selected_backend is None and cls.vendor_kernels()[0]:
            from vllm_kunlun.ops.attention.select import select_kunlun

            path, why = select_kunlun(attn_selector_config)
            if path is not None:
                logger.info_once(
                    "vllm-kunlun: attention backend Kunlun (default %s: %s)",
                    cls._attn_where,
                    why,
                )
                return path
            if attn_selector_config.attn_type == "encoder_only":  # AttentionType
                # The vendor kernels are causal and paged (encoder_portable.py).
                from vllm_kunlun.ops.attention.select import select_portable

                logger.info_once(
                    "vllm-kunlun: encoder-only attention on the portable backend: %s",
                    why,
                )
                return select_portable(attn_selector_config)
            logger.warning_once(
                "vllm-kunlun: the Kunlun attention backend is not used: %s; default "
                "%s instead",
                why,
                cls._attn_default.name,
            )
        backend = selected_backend or cls._attn_default
        if backend not in cls._attn_allowed:
            reason = cls._attn_refused.get(
                backend, f"is not validated {cls._attn_where}"
            )
            names = " or ".join(b.name for b in cls._attn_allowed)
            raise ValueError(
                f"Attention backend {backend.name} cannot run {cls._attn_where}: it "
                f"{reason}. Use {names} (CUSTOM is the plugin's portable torch "
                "backend), or leave --attention-backend unset."
            )
        if backend == AttentionBackendEnum.CUSTOM:
            from vllm_kunlun.ops.attention.select import select_portable

            return select_portable(attn_selector_config)
        logger.info_once(
            "vllm-kunlun: attention backend %s (%s)",
            backend.name,
            "selected" if selected_backend else "default",
        )
        return backend.get_path()

    # ---- vision encoder attention ------------------------------------------------
    @classmethod
    def get_supported_vit_attn_backends(cls) -> list[AttentionBackendEnum]:
        return [AttentionBackendEnum.TORCH_SDPA]

    @classmethod
    def get_vit_attn_backend(
        cls,
        head_size: int,
        dtype: torch.dtype,
        backend: AttentionBackendEnum | None = None,
    ) -> AttentionBackendEnum:
        """The vision encoders' attention (vLLM's ``MMEncoderAttention``): torch SDPA
        per image, the portable path on every platform of ours. No vendor call for
        variable-length encoder attention is pinned in docs/vendor-calls.md, and
        vLLM's other encoder backends need NVIDIA or ROCm binaries, so an explicit
        ``--mm-encoder-attn-backend`` naming one is refused with the reason."""
        if backend is not None and backend != AttentionBackendEnum.TORCH_SDPA:
            reason = _VIT_REFUSED.get(backend, f"is not validated {cls._attn_where}")
            raise ValueError(
                f"Vision encoder attention backend {backend.name} cannot run "
                f"{cls._attn_where}: it {reason}. Use TORCH_SDPA (portable torch "
                "scaled_dot_product_attention), or leave --mm-encoder-attn-backend "
                "unset."
            )
        logger.info_once(
            "vllm-kunlun: vision encoder attention TORCH_SDPA %s (%s)",
            cls._attn_where,
            "selected" if backend else "the portable default",
        )
        return AttentionBackendEnum.TORCH_SDPA

    # ---- distributed --------------------------------------------------------------
    @classmethod
    def stateless_init_device_torch_dist_pg(
        cls,
        backend: str,
        prefix_store: PrefixStore,
        group_rank: int,
        group_size: int,
        timeout: timedelta,
    ) -> ProcessGroup:
        """A process group outside torch's global state (vLLM's DP / KV-transfer groups).

        ``nccl`` is Kunlun's NCCL-compatible collective library behind torch's
        ProcessGroupNCCL; ``gloo`` is served by vLLM's own helper.
        """
        if str(backend) not in cls._pg_backends:
            raise ValueError(
                f"{cls.__name__} supports the {' and '.join(cls._pg_backends)} "
                f"backends, not {backend!r}"
            )
        if str(backend) == "gloo":
            from vllm.distributed.utils import init_gloo_process_group

            return init_gloo_process_group(
                prefix_store, group_rank, group_size, timeout
            )
        from torch.distributed import ProcessGroup
        from torch.distributed.distributed_c10d import ProcessGroupNCCL

        if hasattr(ProcessGroup, "Options"):  # torch < 2.6
            pg = ProcessGroup(  # type: ignore[call-arg]
                prefix_store,
                group_rank,
                group_size,
                ProcessGroup.Options(backend="nccl"),
            )
        else:
            pg = ProcessGroup(prefix_store, group_rank, group_size)  # type: ignore[call-arg]
            pg._set_default_backend(ProcessGroup.BackendType.NCCL)  # type: ignore[attr-defined]
        options = ProcessGroupNCCL.Options()
        options._timeout = timeout
        nccl = ProcessGroupNCCL(prefix_store, group_rank, group_size, options)
        nccl._set_sequence_number_for_group()
        pg._register_backend(torch.device("cuda"), ProcessGroup.BackendType.NCCL, nccl)
        return pg

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        # torch.distributed collectives on the device group (nccl on Kunlun, gloo in
        # emulation); vLLM's CudaCommunicator loads NVIDIA's libnccl through ctypes and
        # custom all-reduce needs vllm._C. See communicator.py for what gloo needs.
        from vllm_kunlun.platforms.communicator import COMMUNICATOR

        return COMMUNICATOR

    @classmethod
    def import_kernels(cls) -> None:
        # vllm._C does not load on torch 2.5.1 (vLLM warns and we rely on none of it);
        # our own ops live in torch.ops.vllm_kunlun, loaded here once per process.
        super().import_kernels()
        from vllm_kunlun.ops import native

        if native.load():
            # vLLM's graph wrapper keeps captured outputs through our weak_ref_tensor.
            apply_phase(Phase.NATIVE_KERNELS)

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        # Hybrid models (Qwen3.5: GDN state + attention KV) need vLLM's hybrid KV cache
        # manager; without it the engine refuses them ("failed to convert the KV cache
        # specs to one unified type"). The state layout is device independent.
        return True

    @classmethod
    def get_punica_wrapper(cls) -> str:
        # LoRA's shrink / expand on the plugin's seam (vllm_kunlun/ops/lora/).
        from vllm_kunlun.platforms.lora import PUNICA_WRAPPER

        return PUNICA_WRAPPER

    # ---- configuration --------------------------------------------------------------
    # Whether the engine-start guards estimate the device-memory budget.
    _budget_guard: bool = True

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        """Quantization schemes the platform cannot run are refused; DeepSeek sparse
        attention (V3.2) is refused and a DeepSeek config written by transformers gets
        its routing keys (models/deepseek_config.py);
        the platform's own
        defaults (``_defaults_first``), the defaults every vllm-kunlun platform shares
        (fusion passes off, LoRA on unsupported models refused) and the platform's own that read them
        (``_defaults_last``); then the engine-start guards: stack, model dimensions and,
        where ``_budget_guard``, the device-memory budget (the model-path guard is
        installed in ``pre_register_and_update``)."""
        from vllm_kunlun.guards.engine_checks import check_engine_config
        from vllm_kunlun.ops.int8.schemes import refuse_group_split, refuse_schemes
        from vllm_kunlun.platforms.kunlun_defaults import (
            apply_kunlun_defaults,
            apply_ray_defaults,
        )

        refuse_schemes(vllm_config.quant_config, cls._attn_where)
        if vllm_config.model_config is not None:
            from vllm_kunlun.models.deepseek_config import (
                complete_routing,
                refuse_sparse,
            )

            refuse_sparse(vllm_config.model_config.hf_config, cls._attn_where)
            complete_routing(vllm_config.model_config.hf_config)
            spec = vllm_config.speculative_config
            if spec is not None and spec.draft_model_config is not None:
                # DeepSeek MTP: the draft reads its own copy of the config.
                complete_routing(spec.draft_model_config.hf_config)
        if vllm_config.quant_config is not None and vllm_config.model_config:
            refuse_group_split(
                vllm_config.quant_config,
                vllm_config.model_config.hf_text_config,
                vllm_config.parallel_config.tensor_parallel_size,
            )
        cls._defaults_first(vllm_config)
        apply_kunlun_defaults(vllm_config)
        apply_ray_defaults(vllm_config, cls.ray_host_cards(vllm_config))
        cls._defaults_last(vllm_config)
        check_engine_config(vllm_config, budget=cls._budget_guard)

    @classmethod
    def ray_host_cards(cls, vllm_config: VllmConfig) -> int:
        """The cards a Ray that vLLM starts on this host counts (as "GPU")."""
        return cls.device_count()

    @classmethod
    def _defaults_first(cls, vllm_config: VllmConfig) -> None:
        """The platform's defaults that go in before the shared ones."""

    @classmethod
    def _defaults_last(cls, vllm_config: VllmConfig) -> None:
        """The platform's defaults that go in after the shared ones."""


class KunlunPlatform(KunlunPlatformBase):
    _banner = "KunlunPlatform active (CUDA-compatibility mode)"
    device_name: str = "cuda"
    device_type: str = "cuda"
    dispatch_key: str = "CUDA"
    # Under Ray the cards are "GPU" resources (Ray cannot detect them: `ray start
    # --num-gpus N`, platforms/kunlun_defaults.py); vLLM sets XPU_VISIBLE_DEVICES to
    # the host's cards in each worker, which the worker copies over Ray's one-card
    # CUDA_VISIBLE_DEVICES (platforms/worker.py).
    ray_device_key: str = "GPU"
    dist_backend: str = "nccl"
    device_control_env_var: str = "XPU_VISIBLE_DEVICES"
    additional_env_vars: list[str] = ["XPU_VISIBLE_DEVICES", *envs.registry()]

    # ---- identity -----------------------------------------------------------------
    # is_cuda() and is_cuda_alike() stay False (OOT): vLLM's cuda-alike paths assume
    # NVIDIA/AMD binaries (vllm._C, custom all-reduce).
    # ---- devices ------------------------------------------------------------------
    @classmethod
    def device_count(cls) -> int:
        return probe_devices().count

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.cuda.get_device_name(device_id)

    @classmethod
    def get_device_uuid(cls, device_id: int = 0) -> str:
        props = torch.cuda.get_device_properties(device_id)
        uuid = getattr(props, "uuid", None)
        if uuid:
            return str(uuid)
        # Kunlun's torch may not expose a uuid: the physical index is unique per host.
        return f"KUNLUN-{cls.device_id_to_physical_device_id(device_id)}"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        # The device's own memory (103.1 GB on a P800), never host RAM.
        return int(torch.cuda.get_device_properties(device_id).total_memory)

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.cuda.set_device(device)
        # Touch the device so its context exists before memory is measured.
        torch.zeros(1, device=device)

    @classmethod
    def get_current_memory_usage(
        cls, device: torch.types.Device | None = None
    ) -> float:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return float(torch.cuda.max_memory_allocated(device))

    # ---- graphs (vllm_kunlun/platforms/graphs.py) -----------------------------------------------
    @classmethod
    def support_static_graph_mode(cls) -> bool:
        return True

    @classmethod
    def get_static_graph_wrapper_cls(cls) -> str:
        return "vllm.compilation.cuda_graph.CUDAGraphWrapper"

    @classmethod
    def opaque_attention_op(cls) -> bool:
        # Attention is one custom op in the compiled graph: the piecewise split point.
        return True

    # ---- configuration (KunlunPlatformBase.check_and_update_config) -----------------
    @classmethod
    def _defaults_last(cls, vllm_config: VllmConfig) -> None:
        from vllm_kunlun.ops.custom_ops import log_enablement
        from vllm_kunlun.platforms.graphs import apply_graph_defaults

        apply_graph_defaults(vllm_config)
        log_enablement(vllm_config)  # after the graph defaults settle the compile mode
