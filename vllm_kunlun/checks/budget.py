"""The doctor's ``kv_budget`` check and the engine-start budget guard's verdict: a
``Budget`` (``checks/memory_budget.py``) of a model shape (``checks/model_shape.py``)
judged ok / warn / fail, with the cause and the fix in the operator's words (the
largest safe ``--gpu-memory-utilization``, more cards, fewer sequences, a W8A8
checkpoint), and the attention page and backend the engine will use.

Why: docs/deployment-log.md D12 (a 27B W8A8 hybrid at TP 8 ran out of memory at
``--gpu-memory-utilization 0.9`` allocating its GDN state; 0.75 worked).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from vllm_kunlun.checks.config_file import ConfigRangeError
from vllm_kunlun.checks.encoder import encoder_peak
from vllm_kunlun.checks.finding import Context, Finding
from vllm_kunlun.checks.memory_budget import (
    DEFAULT_RESERVE_GIB,
    Budget,
    device_memory_bytes,
    estimate,
)
from vllm_kunlun.checks.model_shape import (
    CONFIG_RANGE_FIX,
    ModelShape,
    gib,
    moe_weights,
    weights_bytes_per_card,
)

CARDS_PER_HOST = 8
"""Kunlun P800 cards in one host: the largest tensor-parallel group; more cards take
pipeline stages (``--pipeline-parallel-size``), across hosts with the Ray executor."""


def with_runtime_error(finding: Finding, error: str) -> Finding:
    """The finding, at least a warning, saying that the device runtime raised and the
    budget therefore assumed a P800 rather than the card's real memory."""
    cause = (
        f"reading device 0's memory raised {error}, so the budget assumed a P800 "
        f"(96 GiB); {finding.cause}"
    )
    fix = (
        'fix the device runtime (the devices finding; `python -c "import torch; '
        'print(torch.cuda.get_device_properties(0))"` shows the error) or pass '
        "--device-memory-gib with the card's memory"
    )
    if finding.status == "ok":
        return dataclasses.replace(finding, status="warn", cause=cause, fix=fix)
    return dataclasses.replace(finding, cause=cause, fix=f"{finding.fix}; and {fix}")


def more_memory_fix(budget: Budget, alternative: str = "") -> str:
    """What to change when the weights leave no room: ``alternative`` (e.g. a W8A8
    checkpoint), more cards (tensor parallel within one host, then pipeline stages,
    across hosts with the Ray executor), fewer sequences."""
    parts = [alternative] if alternative else []
    if budget.tp < CARDS_PER_HOST:
        parts.append(
            f"raise --tensor-parallel-size (up to the host's {CARDS_PER_HOST} cards)"
        )
    else:
        parts.append(
            f"more cards than one host's {CARDS_PER_HOST}: --pipeline-parallel-size "
            f"{budget.pp + 1} (each stage {CARDS_PER_HOST} cards, one host per stage "
            "with --distributed-executor-backend ray)"
        )
    parts.append(
        f"lower --max-num-seqs (frees part of the "
        f"{gib(budget.state_bytes + budget.sampler_bytes)} of state and sampler "
        "buffers)"
    )
    return "; or ".join(parts)


def to_finding(
    budget: Budget, details: dict[str, Any], alternative: str = ""
) -> Finding:
    """``alternative``: a first fix to offer when the weights do not fit (the doctor
    names a W8A8 checkpoint's size for a bfloat16 MoE model)."""
    details.update(
        arithmetic=budget.arithmetic(),
        device_bytes=budget.device_bytes,
        weights_bytes=budget.weights_bytes,
        kv_bytes=int(budget.kv_bytes),
        state_bytes=budget.state_bytes,
        headroom_bytes=budget.headroom_bytes,
        max_safe_utilization=budget.max_safe_utilization,
        kv_tokens=budget.kv_tokens,
        activation_bytes=budget.activation_bytes,
        encoder_bytes=budget.encoder_bytes,
    )
    u = budget.utilization
    safe = budget.max_safe_utilization
    taken = (budget.weights_bytes or 0) + budget.activation_bytes
    if safe * budget.device_bytes <= taken:
        moe = (
            f" + MoE workspace {gib(budget.activation_bytes)}"
            if budget.activation_bytes
            else ""
        )
        return Finding(
            "kv_budget",
            "fail",
            f"weights {gib(budget.weights_bytes or 0)}{moe} + state "
            f"{gib(budget.state_bytes)} + headroom {gib(budget.headroom_bytes)} do not "
            f"fit in {gib(budget.device_bytes)} at any --gpu-memory-utilization",
            more_memory_fix(budget, alternative),
            details,
        )
    if budget.kv_bytes <= 0 < budget.kv_bytes + budget.encoder_bytes:
        assert budget.encoder is not None
        room = budget.kv_bytes + budget.encoder_bytes
        pixels = budget.encoder.max_pixels_within(room / 2)
        return Finding(
            "kv_budget",
            "fail",
            f"at --gpu-memory-utilization {u:.2f} the vision encoder at the "
            f"processor's max pixels ({budget.encoder.max_pixels}: "
            f"{gib(budget.encoder_bytes)}) leaves no room for a KV cache "
            f"({gib(room)} after the weights)",
            "lower the images' max pixels, e.g. --mm-processor-kwargs "
            f"'{{\"max_pixels\": {pixels}}}' (its encoder takes half that room), or "
            "serve text only with --limit-mm-per-prompt "
            '\'{"image": 0, "video": 0}\'',
            details,
        )
    if budget.kv_bytes <= 0:
        return Finding(
            "kv_budget",
            "fail",
            f"at --gpu-memory-utilization {u:.2f} the weights "
            f"({gib(budget.weights_bytes or 0)})"
            + (
                f" and the MoE workspace ({gib(budget.activation_bytes)})"
                if budget.activation_bytes
                else ""
            )
            + " fill the whole budget "
            f"({gib(budget.budget_bytes)}): no room for a KV cache",
            f"use --gpu-memory-utilization {safe:.2f}; or {more_memory_fix(budget)}",
            details,
        )
    if not budget.fits:
        return Finding(
            "kv_budget",
            "warn",
            f"at --gpu-memory-utilization {u:.2f} the KV cache leaves "
            f"{gib(budget.beside_bytes)} per card, but the linear-attention state "
            f"({gib(budget.state_bytes)} for {budget.max_num_seqs} seqs) + activation "
            f"headroom ({gib(budget.headroom_bytes)}) need "
            f"{gib(budget.needed_beside_bytes)}: out of memory under full load",
            f"use --gpu-memory-utilization {safe:.2f} (largest safe) or lower "
            "--max-num-seqs",
            details,
        )
    return Finding(
        "kv_budget",
        "ok",
        f"at {u:.2f}: KV <= {gib(budget.kv_bytes)}, state {gib(budget.state_bytes)} + "
        f"headroom {gib(budget.headroom_bytes)} fit in {gib(budget.beside_bytes)} "
        f"beside it (largest safe utilization {safe:.2f})",
        details=details,
    )


def check_kv_budget(ctx: Context, device_runtime: Any = None) -> Finding:
    """``device_runtime``: what answers ``is_available()`` and
    ``get_device_properties(0)`` (torch.cuda when None; a test passes a broken one)."""
    from vllm_kunlun.checks.config_file import read_config
    from vllm_kunlun.checks.model_path import inspect_path

    if not ctx.model:
        return Finding("kv_budget", "skip", "no --model given")
    verdict = inspect_path(ctx.model, ctx.cwd)
    if not (
        verdict.local and os.path.isfile(os.path.join(verdict.path, "config.json"))
    ):
        return Finding(
            "kv_budget", "skip", "needs a local model directory with config.json"
        )
    try:
        config = read_config(verdict.path)
    except (OSError, ValueError) as exc:  # the model_path finding says the same
        return Finding(
            "kv_budget",
            "skip",
            f"config.json cannot be read: {exc}",
            "see the model_path finding",
        )
    try:
        shape = ModelShape.from_config(config)
    except ConfigRangeError as exc:
        return Finding(
            "kv_budget",
            "fail",
            str(exc),
            CONFIG_RANGE_FIX,
        )
    shape = shape.with_mamba_cache_dtype(
        ctx.mamba_cache_dtype, ctx.mamba_ssm_cache_dtype
    )
    memory = device_memory_bytes(ctx.device_memory_bytes, device_runtime)
    device, device_source = memory.total_bytes, memory.source
    tp = ctx.tensor_parallel_size
    weights, weights_source = weights_bytes_per_card(verdict.path, tp), "weight files"
    w8a8: int | None = None
    if shape.is_moe:
        try:
            weights, weights_source, w8a8 = moe_weights(config, tp, weights)
        except ConfigRangeError as exc:
            return Finding("kv_budget", "fail", str(exc), CONFIG_RANGE_FIX)
    if weights is None:  # no files yet: from config.json, int8 for a W8A8 config
        from vllm_kunlun.checks.weights import estimate_weights

        from_config = estimate_weights(config)
        if from_config is not None:
            weights, weights_source = from_config.per_card(tp), from_config.source
    if weights is not None and ctx.max_loras:  # LoRA slots sit beside the weights
        from vllm_kunlun.checks.lora_budget import lora_slot_bytes

        weights += lora_slot_bytes(
            config,
            max_loras=ctx.max_loras,
            max_rank=ctx.max_lora_rank,
            tp=tp,
            dtype_bytes=shape.dtype_bytes,
        )
        weights_source += f" + {ctx.max_loras} LoRA slot(s) of rank {ctx.max_lora_rank}"
    budget = estimate(
        shape,
        device_bytes=device,
        utilization=ctx.gpu_memory_utilization,
        tp=tp,
        max_num_seqs=ctx.max_num_seqs,
        weights_bytes=weights,
        reserve_gib=DEFAULT_RESERVE_GIB if ctx.reserve_gib is None else ctx.reserve_gib,
        pp=ctx.pipeline_parallel_size,
        num_spec=ctx.num_speculative_tokens,
        encoder=encoder_peak(verdict.path, config, shape.dtype_bytes, tp),
    )
    details: dict[str, Any] = {
        "device_memory_source": device_source,
        "model_type": shape.model_type,
        "linear_attention_layers": shape.linear_layers,
        "attention_layers": shape.attention_layers,
        "dtype": shape.dtype,
        "state_dtype": shape.state_dtype or shape.dtype,
        "ssm_state_dtype": shape.recurrent_dtype,
        "weights_source": weights_source,
        "kv_bytes_per_token": budget.kv_bytes_per_token,
    }
    alternative = ""
    if w8a8 is not None:
        verb = "use" if budget.safe_kv_bytes(w8a8) > 0 else "even"
        alternative = (
            f"{verb} a W8A8-INT8 checkpoint (~{gib(w8a8)} per card by the same "
            f"estimate){' would not fit' if verb == 'even' else ''}"
        )
    if w8a8 is not None:
        details["w8a8_weights_bytes"] = w8a8
    finding = to_finding(budget, details, alternative)
    finding = with_attention_path(finding, shape, budget.attention_block_size)
    if memory.runtime_error:
        finding.details["device_runtime_error"] = memory.runtime_error
        finding = with_runtime_error(finding, memory.runtime_error)
    finding.details["arithmetic"][0] += f" [{device_source}]"
    if weights is not None:
        finding.details["arithmetic"][2] += f" [{weights_source}]"
    return finding


def with_attention_path(finding: Finding, shape: ModelShape, page: int) -> Finding:
    """The finding with the page vLLM will pick, the kernel block and the backend that
    serves it on this host (``attention_path``); a page no kernel block fits fails."""
    from vllm_kunlun.checks.attention_path import attention_path
    from vllm_kunlun.ops.attention.block_sizes import DEFAULT_BLOCK_SIZE

    if not shape.attention_layers:
        return finding
    block = page or shape.block_size or DEFAULT_BLOCK_SIZE
    chosen = attention_path(
        head_size=shape.mla_width or shape.head_dim,
        dtype=shape.dtype,
        block_size=block,
        use_mla=bool(shape.mla_width),
    )
    backend = (chosen.backend or "no backend").rsplit(".", 1)[-1]
    finding.details.update(
        attention_block_size=block,
        kernel_block_size=chosen.kernel_block_size,
        attention_backend=chosen.backend,
        attention_platform=chosen.platform,
    )
    line = (
        f"attention: {block}-token pages, kernel block {chosen.kernel_block_size}, "
        f"{backend} on {chosen.platform}"
    )
    if shape.mla_width:
        line += (
            f" (MLA: one {shape.mla_width}-wide latent row per token and layer, "
            "the same on every TP rank)"
        )
        finding.details["mla_latent_width"] = shape.mla_width
    if chosen.backend is None:
        return dataclasses.replace(
            finding,
            status="fail",
            cause=f"{line}: the attention selection refused: {chosen.why}",
            fix="do what the refusal names (an --attention-backend it lists), or serve "
            "a model with attention layers the plugin supports",
        )
    if chosen.kernel_block_size is None:
        from vllm.utils.import_utils import resolve_obj_by_qualname

        from vllm_kunlun.ops.attention.block_sizes import describe_kernel_block_sizes

        sizes = describe_kernel_block_sizes(resolve_obj_by_qualname(chosen.backend))
        return dataclasses.replace(
            finding,
            status="fail",
            cause=f"{line}: its kernel blocks ({sizes}) do not divide the page; the "
            'engine would stop with "No common block size"',
            fix="pass a --block-size its kernel blocks divide, or --attention-backend "
            "CUSTOM (the portable backend runs any page)",
        )
    return dataclasses.replace(finding, cause=f"{finding.cause}; {line}")
