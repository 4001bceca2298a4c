"""Parameters of the other MoE families from config.json: Qwen3-MoE, Qwen3-Next, GLM-4.5,
DeepSeek-V2 / V3 / R1 and Kimi-K2.

Why: the doctor's weight / KV budget needs the weights per card before any weight file
is there (a planning directory with a copied config.json). ``checks/weights.py``
models dense layers only, and ``checks/moe_params.py`` Qwen3.5-MoE only; a Qwen3-30B-A3B
is 96 % routed experts, so without them the estimate is off by an order of magnitude.

How: every tensor transformers 5.2.0 builds for the family's ``*ForCausalLM``
(``models/qwen3_moe``, ``qwen3_next``, ``glm4_moe``), counted from the config as
``moe_params.Tensor`` rows (so the per-card split, the int8 rules of a W8A8 ignore list
and the totals are ``moe_params``'s):

- all: embeddings ``V x H``, ``lm_head`` unless tied, the final norm, two norms per
  layer; full attention ``q_proj`` / ``k_proj`` / ``v_proj`` / ``o_proj`` (biases
  where ``attention_bias``), q / k norms where the family has them;
- the MLP of a layer is sparse where transformers makes it so: Qwen3-MoE and
  Qwen3-Next every ``decoder_sparse_step``-th layer not in ``mlp_only_layers``, GLM
  from layer ``first_k_dense_replace`` on; else dense (``intermediate_size``);
- a sparse block: the router ``E x H`` (GLM adds ``e_score_correction_bias``), the
  routed experts ``E x 3 x H x I_moe``; Qwen3-Next a shared expert
  (``shared_expert_intermediate_size``) and its ``1 x H`` gate, GLM
  ``n_shared_experts`` shared experts fused into one of width ``n x I_moe``;
- Qwen3-Next's Gated DeltaNet layers: ``in_proj_qkvz`` ``2 x key + 2 x value``,
  ``in_proj_ba`` (two rows per value head), the depthwise conv, ``dt_bias``,
  ``A_log``, the gated norm and ``out_proj``; its full attention's ``q_proj`` is
  doubled (the output gate).
- DeepSeek (``deepseek_v2`` / ``deepseek_v3`` / ``kimi_k2``): GLM's MoE layout (dense
  below ``first_k_dense_replace``, shared experts, V3's ``e_score_correction_bias``) with
  multi-head latent attention: ``q_proj`` ``heads x (nope + rope)`` or, with
  ``q_lora_rank``, ``q_a_proj`` / ``q_a_layernorm`` / ``q_b_proj``;
  ``kv_a_proj_with_mqa`` ``kv_lora_rank + rope``, ``kv_a_layernorm``, ``kv_b_proj``
  ``heads x (nope + v_head)`` from the latent, ``o_proj``. vLLM keeps the down
  projections (``q_a_proj``, ``kv_a_proj_with_mqa``) whole on every rank
  (``ReplicatedLinear``) and splits the rest by head.
The MTP layers (GLM's and DeepSeek's ``num_nextn_predict_layers``, Qwen3-Next's
``mtp.*``) are not counted: vLLM's target model does not load them (as ``moe_params`` for Qwen3.5).

``canonical`` maps GLM's and DeepSeek's expert fields to the names ``ModelShape`` reads
(``num_experts``, ``shared_expert_intermediate_size``).
Removal: when the budget reads the parameter count from vLLM's model on the meta device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_kunlun.checks.config_file import ConfigRangeError, config_int
from vllm_kunlun.checks.param_tensor import Tensor

QWEN3_MOE, QWEN3_NEXT, GLM4_MOE = "qwen3_moe", "qwen3_next", "glm4_moe"
DEEPSEEK = ("deepseek_v2", "deepseek_v3", "kimi_k2")
"""vLLM's DeepSeek model: multi-head latent attention, GLM's expert layout."""
MODEL_TYPES = (QWEN3_MOE, QWEN3_NEXT, GLM4_MOE, *DEEPSEEK)
GLM_LAYOUT = (GLM4_MOE, *DEEPSEEK)


def model_type(config: Mapping[str, Any]) -> str:
    return str(config.get("model_type") or "")


def canonical(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """``config`` with GLM's expert fields also under the Qwen names (a copy; other
    families as they are). ConfigRangeError names a missing or bad GLM field."""
    if model_type(config) not in GLM_LAYOUT:
        return config
    out = dict(config)
    out["num_experts"] = config_int(config, "n_routed_experts")
    shared = config_int(config, "n_shared_experts", "", 0, minimum=0)
    out["shared_expert_intermediate_size"] = shared * config_int(
        config, "moe_intermediate_size"
    )
    return out


def _norm(name: str, n: int) -> Tensor:
    return Tensor("norms", name, n, 1, linear=False, split="replicated")


def _mla_tensors(config: Mapping[str, Any], a: str, h: int, heads: int) -> list[Tensor]:
    """One DeepSeek attention layer's tensors (multi-head latent attention)."""

    def get(key: str) -> int:
        return config_int(config, key, "", None, 1)

    rope, nope, v = get("qk_rope_head_dim"), get("qk_nope_head_dim"), get("v_head_dim")
    latent = get("kv_lora_rank")
    q_rows = heads * (nope + rope)
    out: list[Tensor] = []
    if config.get("q_lora_rank") is not None:
        q_lora = get("q_lora_rank")
        out += [
            Tensor("attention", a + "q_a_proj", q_lora, h, split="replicated"),
            _norm(a + "q_a_layernorm", q_lora),
            Tensor("attention", a + "q_b_proj", q_rows, q_lora),
        ]
    else:
        out.append(Tensor("attention", a + "q_proj", q_rows, h))
    out += [
        Tensor(
            "attention", a + "kv_a_proj_with_mqa", latent + rope, h, split="replicated"
        ),
        _norm(a + "kv_a_layernorm", latent),
        Tensor("attention", a + "kv_b_proj", heads * (nope + v), latent),
        Tensor("attention", a + "o_proj", h, heads * v),
    ]
    return out


def family_tensors(config: Mapping[str, Any]) -> list[Tensor] | None:
    """Every tensor of a Qwen3-MoE / Qwen3-Next / GLM-4.5 config, or None for another
    family; ConfigRangeError names a field that is missing or out of range."""
    kind = model_type(config)
    if kind not in MODEL_TYPES:
        return None

    def get(key: str, default: Any = None, minimum: int = 1) -> int:
        return config_int(config, key, "", default, minimum)

    h, vocab, n = get("hidden_size"), get("vocab_size"), get("num_hidden_layers")
    heads = get("num_attention_heads")
    kv = get("num_key_value_heads", heads)
    hd = get("head_dim") if config.get("head_dim") is not None else h // heads
    if hd < 1:
        raise ConfigRangeError("config.json: hidden_size is smaller than the heads")
    bias = bool(config.get("attention_bias", False))
    qk_norm = kind in (QWEN3_MOE, QWEN3_NEXT) or bool(config.get("use_qk_norm", False))
    experts_key = "n_routed_experts" if kind in GLM_LAYOUT else "num_experts"
    experts, inter = get(experts_key), get("moe_intermediate_size")
    dense_inter = get("intermediate_size")
    if kind in GLM_LAYOUT:
        shared = get("n_shared_experts", 0, minimum=0) * inter
        first_dense = get("first_k_dense_replace", 0, minimum=0)
        sparse = [i >= first_dense for i in range(n)]
    else:
        shared = get("shared_expert_intermediate_size", 0, minimum=0)
        step = get("decoder_sparse_step", 1)
        only = config.get("mlp_only_layers") or []
        if not isinstance(only, list):
            raise ConfigRangeError("config.json: mlp_only_layers must be a list")
        sparse = [i not in only and (i + 1) % step == 0 for i in range(n)]
    types = ["full_attention"] * n
    if kind == QWEN3_NEXT:
        listed = config.get("layer_types")
        interval = get("full_attention_interval", 4)
        types = (
            [str(t) for t in listed]
            if isinstance(listed, list)
            else [
                "linear_attention" if (i + 1) % interval else "full_attention"
                for i in range(n)
            ]
        )
        if len(types) != n:
            raise ConfigRangeError(
                f"config.json: layer_types must list num_hidden_layers = {n} entries"
            )
        k_heads, v_heads = get("linear_num_key_heads"), get("linear_num_value_heads")
        key = k_heads * get("linear_key_head_dim")
        dv = get("linear_value_head_dim")
        value = v_heads * dv
        conv = get("linear_conv_kernel_dim")

    out = [Tensor("embeddings", "model.embed_tokens", vocab, h, linear=False)]
    if not config.get("tie_word_embeddings", False):
        out.append(Tensor("lm_head", "lm_head", vocab, h))
    out.append(_norm("model.norm", h))
    for i in range(n):
        p = f"model.layers.{i}."
        if types[i] == "linear_attention":
            a = p + "linear_attn."
            out += [
                Tensor("gdn", a + "in_proj_qkvz", 2 * key + 2 * value, h),
                Tensor("gdn", a + "in_proj_ba", 2 * v_heads, h),
                Tensor("gdn", a + "conv1d", 2 * key + value, conv, linear=False),
                Tensor("gdn", a + "dt_bias", v_heads, 1, linear=False),
                Tensor("gdn", a + "A_log", v_heads, 1, linear=False),
                _norm(a + "norm", dv),
                Tensor("gdn", a + "out_proj", h, value),
            ]
        elif kind in DEEPSEEK:
            out += _mla_tensors(config, p + "self_attn.", h, heads)
        else:
            a = p + "self_attn."
            q_rows = (2 if kind == QWEN3_NEXT else 1) * heads * hd
            out += [
                Tensor("attention", a + "q_proj", q_rows, h),
                Tensor("attention", a + "k_proj", kv * hd, h, split="kv", kv_heads=kv),
                Tensor("attention", a + "v_proj", kv * hd, h, split="kv", kv_heads=kv),
                Tensor("attention", a + "o_proj", h, heads * hd),
            ]
            if bias:
                out += [
                    Tensor("attention", a + "q_proj.bias", q_rows, 1, linear=False),
                    Tensor(
                        "attention",
                        a + "k_proj.bias",
                        kv * hd,
                        1,
                        linear=False,
                        split="kv",
                        kv_heads=kv,
                    ),
                    Tensor(
                        "attention",
                        a + "v_proj.bias",
                        kv * hd,
                        1,
                        linear=False,
                        split="kv",
                        kv_heads=kv,
                    ),
                ]
                if kind != GLM4_MOE:  # Qwen's o_proj has a bias too; GLM's has none
                    out.append(
                        Tensor("attention", a + "o_proj.bias", h, 1, linear=False)
                    )
            if qk_norm:
                out += [_norm(a + "q_norm", hd), _norm(a + "k_norm", hd)]
        m = p + "mlp."
        if not sparse[i]:
            out += [
                Tensor("mlp", m + "gate_proj", dense_inter, h),
                Tensor("mlp", m + "up_proj", dense_inter, h),
                Tensor("mlp", m + "down_proj", h, dense_inter),
            ]
        else:
            out += [
                Tensor("router", m + "gate", experts, h, split="replicated"),
                Tensor("experts", m + "experts.0.gate_proj", inter, h, count=experts),
                Tensor("experts", m + "experts.0.up_proj", inter, h, count=experts),
                Tensor("experts", m + "experts.0.down_proj", h, inter, count=experts),
            ]
            if kind == GLM4_MOE or (kind in DEEPSEEK and kind != "deepseek_v2"):
                out.append(
                    Tensor(
                        "router",
                        m + "gate.e_score_correction_bias",
                        experts,
                        1,
                        linear=False,
                        split="replicated",
                    )
                )
            if shared:
                s = m + ("shared_experts." if kind in GLM_LAYOUT else "shared_expert.")
                out += [
                    Tensor("shared_expert", s + "gate_proj", shared, h),
                    Tensor("shared_expert", s + "up_proj", shared, h),
                    Tensor("shared_expert", s + "down_proj", h, shared),
                ]
                if kind == QWEN3_NEXT:
                    out.append(
                        Tensor(
                            "router",
                            m + "shared_expert_gate",
                            1,
                            h,
                            split="replicated",
                        )
                    )
        out += [
            _norm(p + "input_layernorm", h),
            _norm(p + "post_attention_layernorm", h),
        ]
    return out
