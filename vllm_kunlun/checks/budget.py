"""Check 7: per-card memory budget: weights, KV cache, linear-attention state, headroom.

What happened (docs/deployment-log.md D12: 27B W8A8 hybrid model, TP 8, 256 concurrent requests):
at ``--gpu-memory-utilization 0.9`` vLLM's KV pre-allocation filled 86.24 GiB per card
and allocating the 4.69 GiB GDN (gated delta net) state for 256 running sequences ran
out of memory on all 8 cards; 0.75 (KV about 72 GiB, about 24 GiB left) worked.

The model used here, per card:
  device      D  (torch.cuda's total memory; a P800 has 103.1 GB = 96 GiB)
  budget      U x D  -- what vLLM fills: weights + profiled activations + KV cache
  KV cache    U x D - weights (an upper bound: profiled activations also come out of it)
  beside it   (1 - U) x D must hold:
     linear-attention state  max_num_seqs x linear layers x one state page, where a page
                             is conv (kernel-1) x conv_dim/TP + recurrent (v_heads/TP) x
                             dk x dv in vLLM's --mamba-cache-dtype (auto: the model dtype),
                             padded as vLLM pads it (HybridAttentionMambaModelConfig): the
                             attention block grows in steps of 16 tokens until one
                             attention page holds a state page, and the state page is
                             padded to exactly that attention page
     activation headroom     sampler buffers (2 float32 [max_num_seqs, vocab] tensors
                             in one sampling step: logits and probabilities) + a runtime reserve (Kunlun runtime,
                             collective buffers, allocator fragmentation)
  largest safe U = floor_0.01((D - state - headroom) / D)

The reserve default (6 GiB) is calibrated on the log: at 0.9 a 96 GiB card had 9.6 GiB
beside the KV cache, 4.69 GiB state + ~0.6 GiB sampler buffers left ~4.3 GiB, and that
was not enough; 0.75 left 24 GiB and worked. ``--reserve-gib`` overrides it.
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_kunlun.checks.config_file import (
    CONFIG_LIMITS,
    ConfigRangeError,
    config_int,
    config_key,
)
from vllm_kunlun.checks.encoder import EncoderPeak, encoder_peak
from vllm_kunlun.checks.finding import Context, Finding

GIB = 1 << 30
KERNEL_BLOCK_ALIGNMENT = 16
"""vLLM pads hybrid attention blocks to multiples of 16 tokens (non-MLA backends)."""
P800_MEMORY_BYTES = 96 * GIB
"""One P800 card: 103.1 GB (decimal) = 96 GiB."""
DEFAULT_RESERVE_GIB = 6.0
SAMPLER_BUFFERS = 2
"""float32 [max_num_seqs, vocab] tensors alive in one sampling step with the plugin's
sampler: the logits and the probabilities the vendor kernel draws from. (vLLM's own
sampler also made an exponential-noise tensor and a sorted copy: four; the log's
~0.6 GiB.)"""
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
CARDS_PER_HOST = 8
"""Kunlun P800 cards in one host: the largest tensor-parallel group; more cards take
pipeline stages (``--pipeline-parallel-size``), across hosts with the Ray executor."""

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
    """GDN state dtype (vLLM's --mamba-cache-dtype); empty: the model dtype ('auto')."""
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

    def with_mamba_cache_dtype(self, mamba_cache_dtype: str) -> ModelShape:
        """vLLM's ``--mamba-cache-dtype``: 'auto' keeps the model dtype."""
        if mamba_cache_dtype in ("", "auto"):
            return self
        return dataclasses.replace(self, state_dtype=mamba_cache_dtype)

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
        text = sub or config
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
        dtype = str(
            text.get("dtype")
            or text.get("torch_dtype")
            or config.get("dtype")
            or config.get("torch_dtype")
            or "bfloat16"
        ).replace("torch.", "")

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
        moe = model_type in ("qwen3_5_moe", "qwen3_5_moe_text")

        def moe_dim(key: str, minimum: int = 1) -> int:
            return positive(key, None if minimum else 0, minimum) if moe else 0

        return cls(
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
        replicated when TP exceeds them)."""
        heads = max(1, self.num_kv_heads // tp)
        layers = self.attention_layers + self.draft_attention_layers
        return 2 * layers * heads * self.head_dim * self.dtype_bytes

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
        return (conv + recurrent) * self.state_dtype_bytes

    def attention_page_bytes_per_token(self, tp: int) -> int:
        """K and V of one token in one attention layer on one card."""
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


@dataclass(frozen=True)
class Budget:
    device_bytes: int
    utilization: float
    tp: int
    max_num_seqs: int
    weights_bytes: int | None
    kv_bytes_per_token: int
    state_bytes: int
    sampler_bytes: int
    reserve_bytes: int
    state_page_bytes: int = 0
    """One GDN layer's state of one sequence before vLLM's padding (0: no GDN)."""
    padded_state_page_bytes: int = 0
    attention_block_size: int = 0
    activation_bytes: int = 0
    """MoE workspace at ``activation_tokens`` tokens (0: dense, not counted): vLLM's
    profiling run measures it, so it comes out of the KV cache."""
    activation_tokens: int = 0
    pp: int = 1
    """Pipeline stages: weights, KV cache and state are the busiest stage's."""
    num_spec: int = 0
    """Speculative tokens per step (counted in the state, KV and sampler lines)."""
    encoder: EncoderPeak | None = None
    """The vision tower at the processor's max pixels (checks/encoder.py): vLLM's
    profiling run measures its peak, so it comes out of the KV cache."""

    @property
    def encoder_bytes(self) -> int:
        return self.encoder.bytes if self.encoder is not None else 0

    @property
    def budget_bytes(self) -> float:
        return self.utilization * self.device_bytes

    @property
    def kv_bytes(self) -> float:
        return (
            self.budget_bytes
            - (self.weights_bytes or 0)
            - self.activation_bytes
            - self.encoder_bytes
        )

    def safe_kv_bytes(self, weights_bytes: int) -> float:
        """The KV cache at the largest safe utilization with ``weights_bytes`` of
        weights per card (> 0: such weights would fit)."""
        return (
            self.max_safe_utilization * self.device_bytes
            - weights_bytes
            - self.activation_bytes
            - self.encoder_bytes
        )

    @property
    def kv_tokens(self) -> int:
        if not self.kv_bytes_per_token or self.kv_bytes <= 0:
            return 0
        return int(self.kv_bytes // self.kv_bytes_per_token)

    @property
    def beside_bytes(self) -> float:
        return self.device_bytes - self.budget_bytes

    @property
    def headroom_bytes(self) -> int:
        return self.sampler_bytes + self.reserve_bytes

    @property
    def needed_beside_bytes(self) -> int:
        return self.state_bytes + self.headroom_bytes

    @property
    def fits(self) -> bool:
        return self.needed_beside_bytes <= self.beside_bytes and self.kv_bytes > 0

    @property
    def max_safe_utilization(self) -> float:
        raw = (self.device_bytes - self.needed_beside_bytes) / self.device_bytes
        return math.floor(raw * 100 + 1e-9) / 100

    def arithmetic(self) -> list[str]:
        u, d = self.utilization, self.device_bytes
        w = (
            "unknown (no weight files)"
            if self.weights_bytes is None
            else gib(self.weights_bytes)
        )
        kv_tokens = self.kv_tokens
        moe = bool(self.activation_bytes)
        return [
            f"device {gib(d)} per card, TP {self.tp}"
            f"{f' x PP {self.pp}' if self.pp > 1 else ''}, "
            f"max_num_seqs {self.max_num_seqs}",
            f"vLLM budget = {u:.2f} x {gib(d)} = {gib(self.budget_bytes)}",
            f"weights per card = {w}",
            *(
                [
                    f"MoE activation workspace at {self.activation_tokens} batched "
                    f"tokens = {gib(self.activation_bytes)} (one layer's peak, "
                    "profiled by vLLM: comes out of the KV cache)"
                ]
                if moe
                else []
            ),
            *(
                [
                    f"vision encoder at max pixels {self.encoder.max_pixels} "
                    f"({self.encoder.patches} patches, one image) = "
                    f"{gib(self.encoder_bytes)} (attention scores and activations of "
                    "one block, profiled by vLLM: comes out of the KV cache)"
                ]
                if self.encoder is not None
                else []
            ),
            f"KV cache <= budget - weights{' - MoE workspace' if moe else ''}"
            f"{' - vision encoder' if self.encoder is not None else ''} = "
            f"{gib(self.kv_bytes)} "
            f"(~{kv_tokens} tokens at {self.kv_bytes_per_token} B/token)",
            f"beside the KV cache = (1 - {u:.2f}) x {gib(d)} = {gib(self.beside_bytes)}",
            *(
                [
                    f"state page per GDN layer and sequence = {self.state_page_bytes} B, "
                    f"padded by vLLM to one attention page of "
                    f"{self.attention_block_size} tokens = "
                    f"{self.padded_state_page_bytes} B"
                ]
                if self.padded_state_page_bytes > self.state_page_bytes
                else []
            ),
            *(
                [
                    f"speculative decoding: {self.num_spec} tokens per step: "
                    f"{1 + self.num_spec} GDN state blocks per layer and sequence "
                    f"(conv {self.num_spec} columns wider), the MTP draft's KV in "
                    f"the per-token KV, sampler rows x {1 + self.num_spec}"
                ]
                if self.num_spec
                else []
            ),
            f"linear-attention state = {self.max_num_seqs} seqs x "
            f"{self.state_bytes // max(self.max_num_seqs, 1)} B = {gib(self.state_bytes)}",
            f"activation headroom = sampler {gib(self.sampler_bytes)} + reserve "
            f"{gib(self.reserve_bytes)} = {gib(self.headroom_bytes)}",
            f"needed beside = {gib(self.needed_beside_bytes)} "
            f"{'<=' if self.needed_beside_bytes <= self.beside_bytes else '>'} "
            f"{gib(self.beside_bytes)}",
            f"largest safe utilization = floor(({gib(d)} - "
            f"{gib(self.needed_beside_bytes)}) / {gib(d)}, 0.01) = "
            f"{self.max_safe_utilization:.2f}",
        ]


def estimate(
    shape: ModelShape,
    *,
    device_bytes: int,
    utilization: float,
    tp: int,
    max_num_seqs: int,
    weights_bytes: int | None,
    reserve_gib: float = DEFAULT_RESERVE_GIB,
    pp: int = 1,
    num_spec: int = 0,
    encoder: EncoderPeak | None = None,
) -> Budget:
    """``shape`` is the whole model and ``weights_bytes`` one TP rank's share of all
    layers; with ``pp`` stages each card holds the busiest stage's part of both;
    ``num_spec`` speculative tokens per step (``ModelShape.with_speculation``)."""
    tokens = shape.batched_tokens(device_bytes) if shape.is_moe else 0
    shape = shape.stage(pp).with_speculation(num_spec)
    if weights_bytes is not None:
        weights_bytes = -(-weights_bytes // pp)
    return Budget(
        pp=pp,
        device_bytes=device_bytes,
        utilization=utilization,
        tp=tp,
        max_num_seqs=max_num_seqs,
        weights_bytes=weights_bytes,
        kv_bytes_per_token=shape.kv_bytes_per_token(tp),
        state_bytes=max_num_seqs * shape.state_bytes_per_seq(tp),
        sampler_bytes=SAMPLER_BUFFERS
        * max_num_seqs
        * (1 + shape.num_spec)
        * shape.vocab_size
        * 4,
        num_spec=shape.num_spec,
        reserve_bytes=int(reserve_gib * GIB),
        state_page_bytes=shape.state_page_bytes(tp),
        padded_state_page_bytes=shape.padded_state_page_bytes(tp),
        attention_block_size=shape.attention_block_size(tp)
        if shape.linear_layers and shape.attention_layers
        else 0,
        activation_bytes=shape.moe_workspace_bytes(tp, tokens),
        activation_tokens=tokens,
        encoder=encoder,
    )


def weights_bytes_per_card(model_dir: str, tp: int) -> int | None:
    """Checkpoint size / TP (sharded evenly; replicated norms are negligible)."""
    for pattern in ("*.safetensors", "*.bin", "*.pt"):
        files = glob.glob(os.path.join(model_dir, pattern))
        if files:
            return sum(os.path.getsize(f) for f in files) // tp
    return None


ASSUMED_P800 = "assumed a P800, 103.1 GB = 96 GiB (--device-memory-gib)"


@dataclass(frozen=True)
class DeviceMemory:
    """One card's memory as the budget uses it, where the number came from, and the
    runtime's error when it raised (empty: it answered, or no device was visible)."""

    total_bytes: int
    source: str
    runtime_error: str = ""


def device_memory_bytes(
    explicit: int | None = None, runtime: Any = None
) -> DeviceMemory:
    """Card 0's total memory from the device runtime (``runtime``: torch.cuda unless a
    test hands in another one), or a P800's when none is visible.

    A runtime that raises is not "no device": the budget still assumes a P800, but the
    error is kept so the finding names it (a driver / runtime mismatch on a real card
    would otherwise read as a host without cards)."""
    if explicit:
        return DeviceMemory(explicit, "given")
    try:
        if runtime is None:
            import torch

            runtime = torch.cuda
        if runtime.is_available():
            total = int(runtime.get_device_properties(0).total_memory)
            return DeviceMemory(total, "torch.cuda.get_device_properties(0)")
    except Exception as exc:  # reported in the finding, not swallowed
        error = f"{type(exc).__name__}: {exc}"
        return DeviceMemory(
            P800_MEMORY_BYTES,
            f"the device runtime raised ({error}): {ASSUMED_P800}",
            error,
        )
    return DeviceMemory(P800_MEMORY_BYTES, f"no device visible: {ASSUMED_P800}")


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
    shape = shape.with_mamba_cache_dtype(ctx.mamba_cache_dtype)
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
        "weights_source": weights_source,
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


def with_attention_path(finding: Finding, shape: ModelShape, page: int) -> Finding:
    """The finding with the page vLLM will pick, the kernel block and the backend that
    serves it on this host (``attention_path``); a page no kernel block fits fails."""
    from vllm_kunlun.attention import DEFAULT_BLOCK_SIZE
    from vllm_kunlun.checks.attention_path import attention_path

    if not shape.attention_layers:
        return finding
    block = page or shape.block_size or DEFAULT_BLOCK_SIZE
    chosen = attention_path(
        head_size=shape.head_dim, dtype=shape.dtype, block_size=block
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

        from vllm_kunlun.attention import describe_kernel_block_sizes

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
