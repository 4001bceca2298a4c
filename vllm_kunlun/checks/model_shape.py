"""The model's shape as the memory budget needs it: the dimensions a config.json
describes (``ModelShape``: layers, KV heads, the GDN state page and vLLM's padding of
it, MoE activation workspace), the bounds every dimension must stay within
(``check_config_ranges``), and the weights per card (from the weight files, or for a
Qwen3.5-MoE config from its parameter count).

Part of the doctor's ``kv_budget`` check (``checks/budget.py`` gives the verdict, the
arithmetic is in ``checks/memory_budget.py``).
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_kunlun.checks.config_file import (
    CONFIG_LIMITS,
    ConfigRangeError,
    config_dtype,
    config_int,
    config_key,
)
from vllm_kunlun.checks.moe_families import DEEPSEEK as MLA_TYPES
from vllm_kunlun.checks.moe_families import MODEL_TYPES as MOE_FAMILIES
from vllm_kunlun.checks.moe_families import canonical
from vllm_kunlun.ops.gdn.state_dtype import checkpoint_ssm_dtype, gdn_state_dtypes

GIB = 1 << 30
KERNEL_BLOCK_ALIGNMENT = 16
"""vLLM pads hybrid attention blocks to multiples of 16 tokens (non-MLA backends)."""
# transformers' default layer pattern for hybrid configs without ``layer_types``
# (every ``full_attention_interval``-th layer is full attention, default 4).
_INTERVAL_DEFAULT_TYPES = (
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_text",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
)
DEFAULT_BATCHED_TOKENS_LARGE_CARD = 8192
"""vLLM 0.15.1's ``vllm serve`` default --max-num-batched-tokens on a card of >= 70 GiB
(``EngineArgs.get_batch_defaults``; 2048 on a smaller one)."""
DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


@dataclass(frozen=True)
class ModelShape:
    """The dimensions the budget needs, read from a local config.json (or hf_config)."""

    model_type: str
    num_layers: int
    linear_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype: str
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    state_dtype: str = ""
    """GDN conv state dtype (vLLM's --mamba-cache-dtype); empty: the model dtype."""
    ssm_dtype: str = ""
    """GDN recurrent state dtype (``ops/gdn/state_dtype.py``: --mamba-ssm-cache-dtype,
    else the checkpoint's ``mamba_ssm_dtype``); empty: as the conv state."""
    block_size: int = 0
    """Attention block size the engine was given (--block-size); 0: vLLM's choice."""
    hidden_size: int = 0
    num_experts: int = 0
    """Routed experts per MoE layer (0: a dense model)."""
    experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    max_num_batched_tokens: int = 0
    """Tokens in one engine step (--max-num-batched-tokens); 0: vLLM's default."""
    mtp_layers: int = 0
    """The checkpoint's MTP head layers (``mtp_num_hidden_layers``)."""
    num_spec: int = 0
    """Speculative tokens per step (MTP); 0: no speculative decoding."""
    mla_width: int = 0
    """Multi-head latent attention (DeepSeek): ``kv_lora_rank + qk_rope_head_dim``, the
    one latent row a token keeps per layer, whole on every TP rank (vLLM's
    ``MLAAttentionSpec``: one KV head of that width, no separate V); 0: K / V heads."""

    @property
    def attention_layers(self) -> int:
        return self.num_layers - self.linear_layers

    @property
    def draft_attention_layers(self) -> int:
        """Attention layers the MTP draft adds (their KV cache beside the target's)."""
        return self.mtp_layers if self.num_spec else 0

    def with_speculation(self, num_spec: int) -> ModelShape:
        """``num_spec`` speculative tokens per step (vLLM 0.15.1, method mtp on a
        hybrid): every GDN layer keeps ``1 + num_spec`` state blocks per sequence
        (one per query token, ``num_speculative_blocks``) whose conv part is
        ``num_spec`` columns wider, the draft's attention layers hold KV for every
        token, and the sampler sees ``1 + num_spec`` rows per sequence."""
        return dataclasses.replace(self, num_spec=max(0, int(num_spec)))

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES.get(self.dtype, 2)

    @property
    def state_dtype_bytes(self) -> int:
        return DTYPE_BYTES.get(self.state_dtype or self.dtype, 2)

    @property
    def recurrent_dtype(self) -> str:
        return self.ssm_dtype or self.state_dtype or self.dtype

    @property
    def ssm_dtype_bytes(self) -> int:
        return DTYPE_BYTES.get(self.recurrent_dtype, 2)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def batched_tokens(self, device_bytes: int) -> int:
        if self.max_num_batched_tokens:
            return self.max_num_batched_tokens
        return DEFAULT_BATCHED_TOKENS_LARGE_CARD if device_bytes >= 70 * GIB else 2048

    def moe_workspace_bytes(self, tp: int, tokens: int) -> int:
        """Peak transient memory of one MoE layer for ``tokens`` tokens on one card,
        as the portable grouped-expert path allocates it (``ops/moe/portable.py``;
        the vendor block's own workspace is not published): router logits in the
        model dtype and their float32 softmax ``T x E``, top-k weights (float32) and
        ids (int64) ``T x k``, the gathered tokens and their outputs ``2 x T x k x H``,
        the output ``T x H``, three int64 index vectors ``T x k``, one expert's
        gate / up / activation ``3 x T x I_moe/TP`` and the shared expert's
        ``3 x T x I_shared/TP``. 0 for a dense model. vLLM's profiling run sees it, so
        it comes out of the KV cache, not out of the memory beside it."""
        if not self.is_moe:
            return 0
        b, e, k, h = (
            self.dtype_bytes,
            self.num_experts,
            self.experts_per_tok,
            self.hidden_size,
        )
        inter = -(-self.moe_intermediate_size // tp)
        shared = -(-self.shared_expert_intermediate_size // tp)
        per_token = (
            e * (b + 4)
            + k * (4 + 8)
            + 2 * k * h * b
            + h * b
            + 3 * k * 8
            + 3 * inter * b
            + 3 * shared * b
        )
        return tokens * per_token

    def stage(self, pp: int) -> ModelShape:
        """The busiest pipeline stage of ``pp``: vLLM's default partition gives each
        stage an even share of the layers, so a stage holds at most ceil(1/pp) of
        the GDN and of the attention layers (and their KV cache and state)."""
        if pp <= 1:
            return self
        linear = -(-self.linear_layers // pp)
        attention = -(-self.attention_layers // pp)
        return dataclasses.replace(
            self, num_layers=linear + attention, linear_layers=linear
        )

    def with_mamba_cache_dtype(
        self, mamba_cache_dtype: str, mamba_ssm_cache_dtype: str = "auto"
    ) -> ModelShape:
        """vLLM's ``--mamba-cache-dtype`` and ``--mamba-ssm-cache-dtype`` by the
        plugin's rule (``ops/gdn/state_dtype.py``), over the checkpoint's
        ``mamba_ssm_dtype`` already in ``ssm_dtype``."""
        conv, ssm = gdn_state_dtypes(
            self.dtype, mamba_cache_dtype, mamba_ssm_cache_dtype, self.ssm_dtype or None
        )
        return dataclasses.replace(
            self,
            state_dtype="" if conv == self.dtype else conv,
            ssm_dtype="" if ssm == conv else ssm,
        )

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """Read and range-check the dimensions; ``ConfigRangeError`` names a bad key.

        Every dimension must be an integer within ``CONFIG_LIMITS``: a config with
        1e30 layers would otherwise build a 1e30-entry layer list.
        """
        if not isinstance(config, Mapping):
            raise ConfigRangeError("config.json is not a JSON object")
        sub = config.get("text_config")
        if sub is not None and not isinstance(sub, Mapping):
            raise ConfigRangeError(
                f"config.json: text_config must be an object, got {sub!r:.60}"
            )
        nested = "text_config" if sub else ""
        text = canonical(sub or config)  # GLM's expert fields under the Qwen names
        model_type = str(text.get("model_type") or config.get("model_type") or "")

        def positive(key: str, default: Any = None, minimum: int = 1) -> int:
            return config_int(text, key, nested, default, minimum)

        n = positive("num_hidden_layers")
        types = text.get("layer_types")
        if types is not None and not (
            isinstance(types, list) and all(isinstance(t, str) for t in types)
        ):
            raise ConfigRangeError(
                f"config.json: {config_key(nested, 'layer_types')} must be a list of strings, "
                f"got {types!r:.60}"
            )
        if types is None and model_type in _INTERVAL_DEFAULT_TYPES:
            interval = positive("full_attention_interval", 4)
            types = [
                "linear_attention" if (i + 1) % interval else "full_attention"
                for i in range(n)
            ]
        if types is not None and (
            len(types) != n
            or not set(types) <= {"linear_attention", "full_attention", "attention"}
        ):
            raise ConfigRangeError(
                f"config.json: {config_key(nested, 'layer_types')} must list "
                f"num_hidden_layers = {n} entries of 'linear_attention' / "
                f"'full_attention', got {len(types)}: {sorted(set(map(str, types)))}"
            )
        linear = sum(t == "linear_attention" for t in types or [])
        heads = positive("num_attention_heads")
        dtype = config_dtype(config)

        def dim(key: str) -> int:
            # Needed (and at least 1) only when the model has linear-attention layers.
            return positive(key) if linear else positive(key, 0, minimum=0)

        if text.get("head_dim") is not None:
            head_dim = positive("head_dim")
        else:
            head_dim = positive("hidden_size") // heads
            if head_dim < 1:
                raise ConfigRangeError(
                    f"config.json: {config_key(nested, 'hidden_size')} "
                    f"{text.get('hidden_size')} is smaller than "
                    f"{config_key(nested, 'num_attention_heads')} {heads} (head_dim would "
                    "be 0)"
                )
        if "vocab_size" in text or "vocab_size" not in config:
            vocab = positive("vocab_size")
        else:
            vocab = config_int(config, "vocab_size", "", None, 1)
        moe = model_type in ("qwen3_5_moe", "qwen3_5_moe_text") or (
            model_type in MOE_FAMILIES and "num_experts" in text
        )

        def moe_dim(key: str, minimum: int = 1) -> int:
            return positive(key, None if minimum else 0, minimum) if moe else 0

        mla = 0
        if model_type in MLA_TYPES:
            mla = positive("kv_lora_rank") + positive("qk_rope_head_dim")
        return cls(
            mla_width=mla,
            model_type=model_type,
            num_layers=n,
            linear_layers=linear,
            num_kv_heads=positive("num_key_value_heads", heads),
            head_dim=head_dim,
            vocab_size=vocab,
            dtype=dtype,
            linear_num_key_heads=dim("linear_num_key_heads"),
            linear_num_value_heads=dim("linear_num_value_heads"),
            linear_key_head_dim=dim("linear_key_head_dim"),
            linear_value_head_dim=dim("linear_value_head_dim"),
            linear_conv_kernel_dim=dim("linear_conv_kernel_dim"),
            ssm_dtype=checkpoint_ssm_dtype(config) or "",
            hidden_size=moe_dim("hidden_size"),
            num_experts=moe_dim("num_experts"),
            experts_per_tok=moe_dim("num_experts_per_tok"),
            moe_intermediate_size=moe_dim("moe_intermediate_size"),
            shared_expert_intermediate_size=moe_dim(
                "shared_expert_intermediate_size", minimum=0
            ),
            mtp_layers=positive("mtp_num_hidden_layers", 0, minimum=0),
        )

    def kv_bytes_per_token(self, tp: int) -> int:
        """K and V of every attention layer on one card (KV heads split over TP,
        replicated when TP exceeds them); for MLA the latent row of every layer."""
        layers = self.attention_layers + self.draft_attention_layers
        return layers * self.attention_page_bytes_per_token(tp)

    def state_page_bytes(self, tp: int) -> int:
        """One GDN layer's conv + recurrent state of one sequence on one card, unpadded
        (vLLM 0.15.1 MambaStateShapeCalculator.gated_delta_net_state_shape)."""
        if not self.linear_layers:
            return 0
        conv_dim = (
            2 * self.linear_num_key_heads * self.linear_key_head_dim
            + self.linear_num_value_heads * self.linear_value_head_dim
        )
        conv = (self.linear_conv_kernel_dim - 1 + self.num_spec) * (conv_dim // tp)
        recurrent = (
            (self.linear_num_value_heads // tp)
            * self.linear_key_head_dim
            * self.linear_value_head_dim
        )
        return conv * self.state_dtype_bytes + recurrent * self.ssm_dtype_bytes

    def attention_page_bytes_per_token(self, tp: int) -> int:
        """K and V of one token in one attention layer on one card (MLA: its latent
        row, the same on every rank)."""
        if self.mla_width:
            return self.mla_width * self.dtype_bytes
        return 2 * max(1, self.num_kv_heads // tp) * self.head_dim * self.dtype_bytes

    def attention_block_size(self, tp: int) -> int:
        """The attention block size vLLM settles on for this hybrid model
        (HybridAttentionMambaModelConfig, mamba_cache_mode 'none' or 'align')."""
        page, token = self.state_page_bytes(tp), self.attention_page_bytes_per_token(tp)
        needed = KERNEL_BLOCK_ALIGNMENT * -(-page // (KERNEL_BLOCK_ALIGNMENT * token))
        return max(needed, self.block_size)

    def padded_state_page_bytes(self, tp: int) -> int:
        """The state page as vLLM allocates it: padded to one attention page."""
        page = self.state_page_bytes(tp)
        if not page or not self.attention_layers:
            return page
        return max(
            page,
            self.attention_block_size(tp) * self.attention_page_bytes_per_token(tp),
        )

    def state_bytes_per_seq(self, tp: int) -> int:
        """Gated-delta-net state of one sequence on one card, padding included (one
        block per query token under speculative decoding)."""
        blocks = 1 + self.num_spec
        return self.linear_layers * blocks * self.padded_state_page_bytes(tp)


CONFIG_RANGE_FIX = (
    "fix the model's config.json (it must describe the checkpoint's layers)"
)


def check_config_ranges(config: Mapping[str, Any]) -> None:
    """Every ``CONFIG_LIMITS`` dimension that ``config`` (or its ``text_config``) sets
    must be an integer within its bound; ConfigRangeError names the first that is not.

    Unlike ``ModelShape.from_config`` it requires no field: the engine-start guard asks
    this of every architecture, and configs name their dimensions differently. It is the
    bound that matters there: vLLM builds 100000 layers for ``num_hidden_layers:
    100000`` and is still at it minutes later. The linear-attention fields may be 0, as
    in a model without linear attention.
    """
    sections: list[tuple[str, Mapping[str, Any]]] = [("", config)]
    sub = config.get("text_config")
    if isinstance(sub, Mapping):
        sections.append(("text_config", sub))
    for nested, section in sections:
        for key in CONFIG_LIMITS:
            if section.get(key) is not None:
                minimum = 0 if key.startswith("linear_") else 1
                config_int(section, key, nested, minimum=minimum)


def weights_bytes_per_card(model_dir: str, tp: int) -> int | None:
    """Checkpoint size / TP (sharded evenly; replicated norms are negligible)."""
    for pattern in ("*.safetensors", "*.bin", "*.pt"):
        files = glob.glob(os.path.join(model_dir, pattern))
        if files:
            return sum(os.path.getsize(f) for f in files) // tp
    return None


W8A8_IGNORE = (
    "lm_head",
    "re:.*mlp[.]gate$",
    "re:.*mlp[.]shared_expert_gate$",
    "re:.*visual.*",
    "re:.*mtp.*",
)
"""What a W8A8-INT8 MoE checkpoint keeps in bfloat16 (besides embeddings and norms,
which are no linears): the lm_head, the routers, the shared-expert gates, the vision
tower and the MTP head, as real checkpoints' ``ignore`` lists name them."""


def moe_weights(
    config: Mapping[str, Any], tp: int, from_files: int | None
) -> tuple[int | None, str, int | None]:
    """(weights per card, where that number came from, a W8A8-INT8 checkpoint's weights
    per card or None when the config is already int8) for a Qwen3.5-MoE config.

    The weight files win when there are any (``from_files``); else the config's
    parameter count (``checks/moe_params.py``). ConfigRangeError names a bad field."""
    from vllm_kunlun.checks.moe_params import estimate_moe_weights

    estimate = estimate_moe_weights(config)
    if estimate is None:
        return from_files, "weight files", None
    w8a8: int | None = None
    if not estimate.quantized:
        quantized = dict(config)
        quantized["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 8, "type": "int"},
                }
            },
            "ignore": list(W8A8_IGNORE),
        }
        as_int8 = estimate_moe_weights(quantized)
        w8a8 = as_int8.per_card(tp) if as_int8 is not None else None
    if from_files is not None:
        return from_files, "weight files", w8a8
    return estimate.per_card(tp), estimate.source, w8a8
