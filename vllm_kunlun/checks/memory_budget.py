"""The per-card memory budget's arithmetic: weights, KV cache, linear-attention state,
sampler buffers and headroom (``Budget``, ``estimate``), and the card's memory
(``device_memory_bytes``).

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

import math
from dataclasses import dataclass
from typing import Any

from vllm_kunlun.checks.encoder import EncoderPeak
from vllm_kunlun.checks.model_shape import GIB, ModelShape, gib

P800_MEMORY_BYTES = 96 * GIB
"""One P800 card: 103.1 GB (decimal) = 96 GiB."""
DEFAULT_RESERVE_GIB = 6.0
SAMPLER_BUFFERS = 2
"""float32 [max_num_seqs, vocab] tensors alive in one sampling step with the plugin's
sampler: the logits and the probabilities the vendor kernel draws from. (vLLM's own
sampler also made an exponential-noise tensor and a sorted copy: four; the log's
~0.6 GiB.)"""


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
