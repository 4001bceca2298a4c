"""What actually served the requests: platform, attention backend, Gated DeltaNet
kernels, MoE kernels, sampler, the kernels of quantized linear layers.

Why: the demo, the benchmark and the tests must report what ran, not what should have
run: a silent fallback (a different attention backend, vLLM's own sampler instead of
ours) is exactly the kind of failure the deployment log lost days to
(docs/deployment-log.md D11). The answer has to
come from the worker process, where the model runner lives, so this is a vLLM worker
extension (``worker_extension_cls``): ``llm.collective_rpc(SERVING_INFO_METHOD)``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

WORKER_EXTENSION = "vllm_kunlun.demo.serving_info.ServingInfo"
SERVING_INFO_METHOD = "vllm_kunlun_serving_info"
USE_VLLM_SAMPLER_METHOD = "vllm_kunlun_use_vllm_sampler"


def _qualname(obj: Any) -> str | None:
    if obj is None:
        return None
    func = getattr(obj, "__func__", obj)  # bound method -> function
    if not hasattr(func, "__qualname__"):
        func = type(func)
    return f"{func.__module__}.{func.__qualname__}"


class ServingInfo:
    """Mixed into vLLM's worker class; every method name is prefixed to avoid clashes."""

    def vllm_kunlun_use_vllm_sampler(self) -> str | None:
        """Put vLLM's own ``TopKTopPSampler`` back into this worker's sampler.

        For benchmarks that compare ours against vLLM's: the plugin's worker installs
        ours whatever ``VLLM_PLUGINS`` says. Returns the forward that now samples.
        """
        from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

        sampler = self.model_runner.sampler  # type: ignore[attr-defined]
        sampler.topk_topp_sampler = TopKTopPSampler(sampler.logprobs_mode)
        return _qualname(sampler.topk_topp_sampler.forward)

    def vllm_kunlun_serving_info(self) -> dict[str, Any]:
        from vllm.platforms import current_platform

        runner = getattr(self, "model_runner", None)
        sampler = getattr(runner, "sampler", None)
        topk_topp = getattr(sampler, "topk_topp_sampler", None)
        context = self.vllm_config.compilation_config.static_forward_context  # type: ignore[attr-defined]
        backends = set()
        impls = set()
        for layer in context.values():
            backend = getattr(layer, "attn_backend", None)
            if backend is not None:
                backends.add(f"{backend.get_name()} ({_qualname(backend)})")
            if getattr(layer, "impl", None) is not None:
                impls.add(_qualname(type(layer.impl)))
        linear_kernels = set()
        for module in getattr(getattr(runner, "model", None), "modules", list)():
            scheme = getattr(module, "scheme", None)  # compressed-tensors' layers
            kernel = getattr(scheme, "kernel", None)
            if kernel is not None:
                linear_kernels.add(_qualname(type(kernel)))
        # The speculative draft (MTP head): each quantized layer and its kernel.
        drafter = getattr(getattr(runner, "drafter", None), "model", None)
        draft_kernels = {
            name: _qualname(type(module.scheme.kernel))
            for name, module in (drafter.named_modules() if drafter is not None else [])
            if getattr(getattr(module, "scheme", None), "kernel", None) is not None
        }
        int8 = None
        if any("vllm_kunlun" in str(k) for k in linear_kernels) and runner is not None:
            from vllm_kunlun.ops.int8.seam import select_kernels as select_int8

            chosen_int8 = select_int8(runner.device)
            int8 = f"{chosen_int8.name} ({chosen_int8.reason})"
        from vllm_kunlun.ops import custom_ops, routes

        model = getattr(runner, "model", None)
        kernels = None
        select = getattr(topk_topp, "kernels", None)  # the plugin's sampler
        if callable(select) and runner is not None:
            chosen = select(runner.device)
            kernels = f"{chosen.name} ({chosen.reason})"
        return {
            "pid": os.getpid(),
            "platform": _qualname(type(current_platform)),
            "device_name": current_platform.get_device_name(),
            "attention_backends": sorted(backends),
            "attention_impls": sorted(i for i in impls if i),
            "sampler": _qualname(type(sampler)) if sampler is not None else None,
            "topk_topp_sampler": _qualname(type(topk_topp)) if topk_topp else None,
            "topk_topp_forward": _qualname(getattr(topk_topp, "forward", None)),
            "sampling_kernels": kernels,
            # CustomOps replaced for the vendor kernels, and what each route served.
            "custom_ops": custom_ops.describe_model(model) if model is not None else {},
            "vendor_kernels": routes.status(),
            **_graphs(self.vllm_config.compilation_config),  # type: ignore[attr-defined]
            "linear_kernels": sorted(k for k in linear_kernels if k),
            "int8_kernels": int8,
            "draft_linear_kernels": draft_kernels,
            "gdn_kernels": _gdn_kernels(),
            "gdn_state_dtypes": _gdn_state_dtypes(model),
            "moe_kernels": _moe_kernels(),
            "wna16_kernels": _wna16_kernels(),
            "moe_experts": _moe_experts(model),
            "mla_kernels": _mla_kernels(),
            "kv_blocks": _kv_blocks(runner),
        }


def _gdn_kernels() -> list[dict[str, str]]:
    """What each Gated DeltaNet op ran on; empty when no GDN layer ran (the seam is
    imported by the hybrid models' layer patches only)."""
    seam = sys.modules.get("vllm_kunlun.ops.gdn.seam")
    return seam.served() if seam is not None else []


def _gdn_state_dtypes(model: Any) -> list[str] | None:
    """(conv, recurrent) dtypes of the first Gated DeltaNet layer's states as the
    engine allocated them; None for a model without such layers."""
    for module in getattr(model, "modules", list)():
        if "GatedDeltaNet" in type(module).__name__ and hasattr(
            module, "get_state_dtype"
        ):
            return [str(d).removeprefix("torch.") for d in module.get_state_dtype()]
    return None


def _moe_experts(model: Any) -> dict[str, Any] | None:
    """How this rank holds the routed experts (the first MoE layer's; all layers are
    alike): which experts, how wide, int8 or not. None for a model without them. Found
    by the attributes ``models/qwen3_5_moe.py``'s experts carry (demo/ does not import
    models/)."""
    for module in getattr(model, "modules", list)():
        if hasattr(module, "local_experts") and hasattr(module, "expert_start"):
            return {
                "num_experts": int(module.num_experts),
                "expert_start": int(module.expert_start),
                "local_experts": int(module.local_experts),
                "intermediate": int(module.local_intermediate),
                "quantized": bool(module.quantized),
            }
    return None


def _moe_kernels() -> list[dict[str, Any]]:
    """What the MoE layers ran on (device, path, reason, calls); empty when no MoE layer
    ran (the seam is imported by the MoE model only)."""
    seam = sys.modules.get("vllm_kunlun.ops.moe.seam")
    return seam.served() if seam is not None else []


def _mla_kernels() -> list[dict[str, Any]]:
    """What the MLA decodes ran on (device, path, reason, calls); empty when no MLA
    layer decoded (the seam is imported by the MLA backend only)."""
    seam = sys.modules.get("vllm_kunlun.ops.mla.seam")
    return seam.served() if seam is not None else []


def _wna16_kernels() -> list[dict[str, Any]]:
    """What the weight-only integer (W4A16) layers ran on (device, path, reason,
    calls); empty when none ran (the seam is imported by their kernel only)."""
    seam = sys.modules.get("vllm_kunlun.ops.int4.seam")
    return seam.served() if seam is not None else []


def _kv_blocks(runner: Any) -> list[dict[str, Any]]:
    """Per KV cache group: its kind, the KV manager's block (a hybrid's attention page)
    and the block the kernels index (smaller when the runner splits pages)."""
    config = getattr(runner, "kv_cache_config", None)
    tables = getattr(getattr(runner, "input_batch", None), "block_table", None)
    tables = getattr(tables, "block_tables", None) or []
    if config is None:
        return []
    groups = []
    for i, group in enumerate(config.kv_cache_groups):
        spec = group.kv_cache_spec
        kernel = tables[i].block_size if i < len(tables) else None
        groups.append(
            {
                "kind": type(spec).__name__,
                "layers": len(group.layer_names),
                "manager_block_size": spec.block_size,
                "kernel_block_size": kernel,
            }
        )
    return groups


def _graphs(compilation: Any) -> dict[str, Any]:
    """How the model ran: compiled or not, graph mode, graphs captured in this worker."""
    from vllm.compilation.counter import compilation_counter

    return {
        "compilation_mode": compilation.mode.name,
        "cudagraph_mode": compilation.cudagraph_mode.name,
        "cudagraphs_captured": compilation_counter.num_cudagraph_captured,
    }
