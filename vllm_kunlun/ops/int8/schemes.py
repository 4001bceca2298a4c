"""Which quantized checkpoints a vllm-kunlun platform runs, refused at engine start.

Why: the plugin brings two quantized kernels, W8A8-INT8 (``int8_kernel.py``) and
weight-only integer W4A16 / W8A16 (``ops/int4/``: compressed-tensors through
``wna16_kernel.py``, AWQ through ``awq_method.py``). vLLM
0.15.1 lets an out-of-tree platform configure any quantization method, and then fails
far from the cause: an FP8 config on the host dies with "Found no NVIDIA driver" while
the model is built, a compressed-tensors FP8 or 4-bit scheme in a kernel that is not
there. How: ``refuse_method`` (from ``verify_quantization``, when vLLM reads the
method) lets only ``compressed-tensors``, ``awq`` and ``gptq`` through; ``refuse_schemes`` (from the
platforms' ``check_and_update_config``, once vLLM built the quantization config) lets
through only the groups vLLM itself would serve with ``CompressedTensorsW8A8Int8``
(its own ``_is_static_tensor_w8a8`` / ``_is_dynamic_token_w8a8`` tests, int weights and
activations) or with ``CompressedTensorsWNA16`` in the ``pack-quantized`` format (its
``_is_wNa16_group_channel`` test, 4 or 8 int bits, no activation order by group), no
KV-cache scheme and no sparsity; AWQ only 4-bit with zero points (what vLLM's AWQ
reads), GPTQ only 4 and 8 bits (``ops/int4/gptq_method.py``). Each refusal names the scheme and
what is supported. Removal: when the platform runs more schemes (add them here).
"""

from __future__ import annotations

from typing import Any

SUPPORTED_METHODS = ("compressed-tensors", "awq", "gptq")
SUPPORTED = (
    "compressed-tensors W8A8-INT8 (llm-compressor's W8A8 preset: 8-bit symmetric int "
    "weights per channel or per tensor, 8-bit int activations dynamic per token or "
    "static per tensor) and compressed-tensors W4A16 / W8A16 (format pack-quantized: "
    "4- or 8-bit int weights per group or per channel, symmetric or with zero points, "
    "float activations), AWQ (4-bit GEMM checkpoints with zero points, float16) and "
    "GPTQ (4- or 8-bit, desc_act or not, float16)"
)
_FIX = (
    "Serve a W8A8-INT8 or pack-quantized W4A16 compressed-tensors checkpoint, an AWQ "
    "or GPTQ checkpoint or the unquantized model."
)
WNA16_BITS = (4, 8)
FP8_DEQUANTIZE = (
    " FP8 checkpoints as DeepSeek releases them (DeepSeek-V3 / V3.1 / R1: e4m3 weights "
    "with 128 x 128 block scales) must be dequantized to BF16 first: the DeepSeek-V3 "
    "repository's inference/fp8_cast_bf16.py does it (python fp8_cast_bf16.py "
    "--input-fp8-hf-path FP8_DIR --output-bf16-hf-path BF16_DIR; copy the tokenizer and "
    "config.json without its quantization_config), or serve a BF16 or W8A8-INT8 "
    "release of the model."
)
# Per method, how to get the unquantized model where none is released.
_HOW = {
    "mxfp4": (
        " gpt-oss ships MXFP4 experts only: dequantize them to bf16 once with "
        "transformers (from_pretrained(..., quantization_config=Mxfp4Config("
        "dequantize=True)), then save_pretrained) and serve that directory."
    ),
    "fp8": FP8_DEQUANTIZE,
}


def refuse_method(quant: str | None, where: str) -> None:
    """Raise ``ValueError`` unless ``quant`` (vLLM's method name) can run ``where``."""
    if quant is None or quant in SUPPORTED_METHODS:
        return
    raise ValueError(
        f"{quant} quantization cannot run {where}: vllm-kunlun serves only "
        f"{SUPPORTED}. {_FIX}{_HOW.get(quant, '')}"
    )


def _describe(args: Any) -> str:
    if args is None:
        return "none"
    kind = getattr(args.type, "value", args.type)
    strategy = getattr(args.strategy, "value", args.strategy)
    dynamic = "dynamic" if args.dynamic else "static"
    symmetric = "symmetric" if args.symmetric else "asymmetric"
    return f"{args.num_bits}-bit {kind} {strategy} {dynamic} {symmetric}"


def is_served_wna16(weights: Any, inputs: Any, fmt: str | None) -> bool:
    """A weight-only group that ``KunlunWNA16LinearKernel`` serves."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    actorder = getattr(weights, "actorder", None)
    return (
        weights is not None
        and fmt == "pack-quantized"
        and getattr(weights.type, "value", weights.type) == "int"
        and weights.num_bits in WNA16_BITS
        and getattr(actorder, "value", actorder) != "group"
        and CompressedTensorsConfig._is_wNa16_group_channel(weights, inputs)
    )


def unsupported_schemes(quant_config: Any) -> list[str]:
    """What in ``quant_config`` the platform cannot run, one line each ([] if all)."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    if quant_config is None:
        return []
    if quant_config.get_name() == "awq":
        if quant_config.weight_bits != 4 or not quant_config.zero_point:
            return [
                f"AWQ {quant_config.weight_bits}-bit, zero_point="
                f"{quant_config.zero_point}"
            ]
        return []
    if quant_config.get_name() == "gptq":
        bits = {quant_config.weight_bits}
        bits |= {int(o["bits"]) for o in quant_config.dynamic.values() if "bits" in o}
        if not bits <= set(WNA16_BITS):
            return [f"GPTQ {'/'.join(map(str, sorted(bits)))}-bit weights"]
        return []
    if not isinstance(quant_config, CompressedTensorsConfig):
        return [f"quantization method {quant_config.get_name()}"]
    found = []
    for targets, group in quant_config.target_scheme_map.items():
        weights, inputs = group.get("weights"), group.get("input_activations")
        int8 = (
            weights is not None
            and inputs is not None
            and getattr(weights.type, "value", weights.type) == "int"
            and getattr(inputs.type, "value", inputs.type) == "int"
            and (
                CompressedTensorsConfig._is_static_tensor_w8a8(weights, inputs)
                or CompressedTensorsConfig._is_dynamic_token_w8a8(weights, inputs)
            )
        )
        fmt = group.get("format") or quant_config.quant_format
        if not int8 and not is_served_wna16(weights, inputs, fmt):
            found.append(
                f"layers {targets!r}: weights {_describe(weights)}, activations "
                f"{_describe(inputs)}"
            )
    if getattr(quant_config, "kv_cache_scheme", None):
        found.append(f"kv_cache_scheme {quant_config.kv_cache_scheme}")
    if getattr(quant_config, "sparsity_scheme_map", None):
        found.append("sparsity (sparsity_config)")
    return found


def refuse_schemes(quant_config: Any, where: str) -> None:
    """Raise ``ValueError`` naming every scheme of ``quant_config`` that cannot run."""
    found = unsupported_schemes(quant_config)
    if found:
        raise ValueError(
            f"this checkpoint's quantization cannot run {where}: "
            f"{'; '.join(found)}. vllm-kunlun serves only {SUPPORTED}. {_FIX}"
        )


def _group_sizes(quant_config: Any) -> list[int]:
    """The weight-only group sizes of ``quant_config`` (-1 / None per channel left out)."""
    name = quant_config.get_name()
    if name in ("awq", "gptq"):
        sizes = [quant_config.group_size]
        if name == "gptq":
            sizes += [
                int(o["group_size"])
                for o in quant_config.dynamic.values()
                if "group_size" in o
            ]
        return [g for g in sizes if g and g > 0]
    sizes = []
    for group in getattr(quant_config, "target_scheme_map", {}).values():
        weights = group.get("weights")
        if (
            weights is not None
            and group.get("input_activations") is None
            and weights.group_size
            and weights.group_size > 0
        ):
            sizes.append(int(weights.group_size))
    return sizes


def group_split_problems(quant_config: Any, text_config: Any, tp: int) -> list[str]:
    """Row-parallel inputs (attention output, MLP down projection) whose per-rank
    slice at tensor parallel ``tp`` would cut a quantization group, one line each."""
    if quant_config is None or tp <= 1:
        return []
    sizes = _group_sizes(quant_config)
    if not sizes:
        return []
    heads = getattr(text_config, "num_attention_heads", None)
    head_dim = getattr(text_config, "head_dim", None) or (
        getattr(text_config, "hidden_size", 0) // heads if heads else None
    )
    inputs = {
        "o_proj input (heads x head_dim)": heads * head_dim
        if heads and head_dim
        else None,
        "down_proj input (intermediate_size)": getattr(
            text_config, "intermediate_size", None
        ),
    }
    found = []
    for what, width in inputs.items():
        if not isinstance(width, int):
            continue
        for g in sorted(set(sizes)):
            if width % tp or (width // tp) % g:
                found.append(
                    f"tensor parallel {tp} leaves {what} {width} / {tp} = "
                    f"{width / tp:g} features per rank, not a multiple of group_size {g}"
                )
    return found


def refuse_group_split(quant_config: Any, text_config: Any, tp: int) -> None:
    """Raise ``ValueError`` naming the tensor-parallel size when a rank's slice of a
    row-parallel layer would cut a weight-only quantization group."""
    found = group_split_problems(quant_config, text_config, tp)
    if found:
        raise ValueError(
            "this checkpoint's quantization groups cannot be split across ranks: "
            + "; ".join(found)
            + ". Serve with a tensor-parallel size that divides each of these inputs "
            "into whole groups."
        )
