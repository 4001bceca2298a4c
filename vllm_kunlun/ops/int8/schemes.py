"""Which quantized checkpoints a vllm-kunlun platform runs, refused at engine start.

Why: the plugin brings one quantized kernel, W8A8-INT8 (``int8_kernel.py``). vLLM
0.15.1 lets an out-of-tree platform configure any quantization method, and then fails
far from the cause: an FP8 config on the host dies with "Found no NVIDIA driver" while
the model is built, a compressed-tensors FP8 or 4-bit scheme in a kernel that is not
there. How: ``refuse_method`` (from ``verify_quantization``, when vLLM reads the
method) lets only ``compressed-tensors`` through; ``refuse_schemes`` (from the
platforms' ``check_and_update_config``, once vLLM built the quantization config) lets
through only the groups vLLM itself would serve with ``CompressedTensorsW8A8Int8``
(its own ``_is_static_tensor_w8a8`` / ``_is_dynamic_token_w8a8`` tests, int weights and
activations), no KV-cache scheme and no sparsity. Each refusal names the scheme and
what is supported. Removal: when the platform runs more schemes (add them here).
"""

from __future__ import annotations

from typing import Any

SUPPORTED_METHOD = "compressed-tensors"
SUPPORTED = (
    "compressed-tensors W8A8-INT8 (llm-compressor's W8A8 preset: 8-bit symmetric int "
    "weights per channel or per tensor, 8-bit int activations dynamic per token or "
    "static per tensor)"
)
_FIX = "Serve a W8A8-INT8 compressed-tensors checkpoint or the unquantized model."
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
    if quant is None or quant == SUPPORTED_METHOD:
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


def unsupported_schemes(quant_config: Any) -> list[str]:
    """What in ``quant_config`` the platform cannot run, one line each ([] if all)."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    if quant_config is None:
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
        if not int8:
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
