"""Device memory of the LoRA slots: what ``--enable-lora`` adds beside the weights.

Why: vLLM allocates, on every card and for every LoRA-capable linear layer of the
model (attention q/k/v and o, MLP gate/up and down), ``--max-loras`` slots of
``--max-lora-rank`` for A and for B, whether or not an adapter is loaded. With 4 slots
of rank 64 on a 32B model that is gigabytes taken from the KV cache; the budget guard
counts them with the weights so that its estimate (and the KV cache it promises)
stays honest. Tensor parallel (vLLM's default, not fully sharded): a column-parallel
layer keeps A whole and splits B's rows; a row-parallel layer splits A's columns and
keeps B whole. Hybrids with ``layer_types`` (Qwen3.5) are counted per layer: a
full-attention layer's q_proj also holds the output gate (twice the query width), a
Gated DeltaNet layer has in_proj_qkv (three slices), in_proj_z, in_proj_b / in_proj_a
(two slices), out_proj, and conv1d, which vLLM wraps too (never applied: the adapter
check refuses adapters on it). The lm_head and embeddings get no LoRA slots in vLLM 0.15.1 models
unless an adapter targets them, and are not counted. Adapters kept on the host
(``--max-cpu-loras``) use host memory and are not counted either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def lora_slot_bytes(
    config: Mapping[str, Any],
    *,
    max_loras: int,
    max_rank: int,
    tp: int,
    dtype_bytes: int,
) -> int:
    """Bytes of LoRA slots one card holds for a dense decoder's ``config`` (the text
    config of config.json); 0 when a dimension is missing."""
    text = config.get("text_config") or config
    try:
        h = int(text["hidden_size"])
        inter = int(text["intermediate_size"])
        heads = int(text["num_attention_heads"])
        kv = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or h // heads)
        layers = int(text["num_hidden_layers"])
    except (KeyError, TypeError, ValueError):
        return 0
    r = max_rank

    def column(in_size: int, out_size: int) -> int:  # A whole, B split by rows
        return r * in_size + (out_size // tp) * r

    def row(in_size: int, out_size: int) -> int:  # A split by columns, B whole
        return r * (in_size // tp) + out_size * r

    q, kv_out = heads * head_dim, kv * head_dim
    mlp = 2 * column(h, inter) + row(inter, h)
    layer_types = text.get("layer_types")
    if not layer_types:
        attention = column(h, q) + 2 * column(h, kv_out) + row(q, h)
        return (attention + mlp) * layers * max_loras * dtype_bytes
    gate = 2 if text.get("attn_output_gate", True) else 1
    full = column(h, gate * q) + 2 * column(h, kv_out) + row(q, h)
    try:
        key = int(text["linear_num_key_heads"]) * int(text["linear_key_head_dim"])
        v_heads = int(text["linear_num_value_heads"])
        value = v_heads * int(text["linear_value_head_dim"])
        kernel = int(text["linear_conv_kernel_dim"])
    except (KeyError, TypeError, ValueError):
        return 0
    gdn = (
        2 * column(h, key)  # in_proj_qkv: q, k, v slices
        + column(h, value)
        + column(h, value)  # in_proj_z
        + 2 * column(h, v_heads)  # in_proj_b, in_proj_a
        + row(value, h)  # out_proj
        + column(kernel, 2 * key + value)  # conv1d, wrapped though never applied
    )
    total = sum(
        (full if kind == "full_attention" else gdn) + mlp
        for kind in layer_types[:layers]
    )
    return total * max_loras * dtype_bytes
