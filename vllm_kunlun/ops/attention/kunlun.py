"""The Kunlun attention backend: vLLM's paged attention on the ``kunlun_ops`` kernels.

Why: vLLM's Triton backend, the fallback default on Kunlun, depends on the vendor's
Triton build compiling vLLM 0.15.1's kernels; the vendor library ships paged attention
kernels of its own (the ones upstream serves P800 with). This backend is the default on
a Kunlun host when ``kunlun_ops`` has them (``platforms/kunlun.py``).

How: the KV cache of a layer is ``[2, num_blocks, num_kv_heads, block_size,
head_size]`` (BHLD halves, the kernels' layout). vLLM orders decodes first (reorder
threshold 1); one step makes at most four calls per layer (``ops/attention/paged_vendor.py``):
``reshape_and_cache_flash`` for the new tokens, ``paged_attention`` for the decodes,
and ``prefill_attention`` for the rest, over the new tokens alone when no prefill has
cached context, else over the paged cache (chunked prefill, prefix-cache hits, spec
tokens). Lengths and offsets are planned once per step in ``build_metadata``.
Hybrid models (attention beside Mamba/GDN layers in one KV memory pool): vLLM re-strides
the cache so that K and V of a block are adjacent pages; ``kv_views`` turns that into
two contiguous tensors with doubled block ids, so the kernels never see strides.

Layers with a sliding window, logit soft-capping or attention sinks attend on the
portable kernel (``paged_portable.attend`` over this backend's BHLD pages, the reason
logged once): the decode call ``paged_attention`` takes no window, no sinks and no
cap, and no call form takes a cap; the cache write stays on ``reshape_and_cache_flash``.
(``prefill_attention``'s call form names ``swa_left`` / ``sink``, but a layer's decodes
would still need the portable kernel, and its window convention is unverified off the
hardware.)

Refused, with the reason and the fix, when the layer is built: ALiBi, a softmax scale
other than ``1/sqrt(head_size)`` (no call form takes a scale), non-decoder attention,
quantized KV caches, head sizes the kernels do not list.

vLLM knows out-of-tree backends only as ``AttentionBackendEnum.CUSTOM``: ``get_name()``
says CUSTOM (the layer maps the name back to the enum), and the platform returns this
class path itself, so the CUSTOM slot keeps pointing at the portable backend.

Removal: when vLLM ships a Kunlun attention backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionMetadata,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

from vllm_kunlun.logger import init_logger
from vllm_kunlun.ops import chooser
from vllm_kunlun.ops.attention import paged_portable as portable
from vllm_kunlun.ops.attention import paged_vendor as ops
from vllm_kunlun.ops.attention.common import (
    DecodesFirstMetadataBuilder,
    PluginAttentionBackend,
    PluginAttentionImpl,
)
from vllm_kunlun.ops.routes import Route

logger = init_logger(__name__)

BACKEND_PATH = "vllm_kunlun.ops.attention.kunlun.KunlunAttentionBackend"
DISPLAY_NAME = "vllm-kunlun Kunlun attention (kunlun_ops kernels)"
# The head sizes upstream's Kunlun paged attention lists as supported.
SUPPORTED_HEAD_SIZES = [32, 64, 80, 96, 112, 120, 128, 192, 256, 512]
# Kernel block sizes: the vendor kernels read the block size from the cache tensor's
# shape (upstream passes ``block_size=key_cache.shape[2]`` where a call names it) and
# upstream declares no constraint, so its pages are whatever vLLM picks: 16 by default
# and multiples of 16 for hybrids (vLLM aligns hybrid pages to 16 tokens). Multiples of
# 16 is what has been run; another size (``--block-size 8``) falls back, logged.
KERNEL_BLOCK_ALIGNMENT = 16
FIX = "Use --attention-backend TRITON_ATTN (or CUSTOM, the portable torch backend)."


@dataclass
class DecodeMetadata:
    block_table: torch.Tensor  # [decodes, max_blocks] int32
    seq_lens: torch.Tensor  # [decodes] int32, the new token included
    seq_lens_cpu: torch.Tensor


@dataclass
class PrefillMetadata:
    block_table: torch.Tensor  # [prefills, max_blocks] int32
    q_lod: torch.Tensor  # [prefills + 1] int32 offsets of the new tokens
    q_lod_cpu: torch.Tensor
    kv_lod: torch.Tensor  # [prefills + 1] int32 offsets of the whole sequences
    kv_lod_cpu: torch.Tensor
    has_context: bool  # some prefill continues cached tokens


@dataclass
class PagedIndex:
    """Slots and block tables for one cache layout (see ``kv_views``)."""

    slot_mapping: torch.Tensor
    decode_block_table: torch.Tensor | None
    prefill_block_table: torch.Tensor | None


@dataclass
class KunlunAttentionMetadata(AttentionMetadata):
    num_actual_tokens: int
    num_decode_tokens: int
    slot_mapping: torch.Tensor  # [num_actual_tokens] int64, negative: do not write
    decode: DecodeMetadata | None
    prefill: PrefillMetadata | None
    common: CommonAttentionMetadata | None = None
    _index: dict[tuple[int, int], PagedIndex] = field(default_factory=dict)
    _portable: dict[tuple[int, int], portable.AttentionPlan] = field(
        default_factory=dict
    )

    def portable_plan(
        self, block_size: int, block_multiplier: int
    ) -> portable.AttentionPlan:
        """The portable kernel's plan of this step over this backend's pages (for the
        layers it serves); computed once per step, by the first layer that asks."""
        key = (block_size, block_multiplier)
        found = self._portable.get(key)
        if found is not None:
            return found
        m = self.common
        if m is None:
            raise ValueError(f"{DISPLAY_NAME}: metadata built without the step's plan")
        index = self.index(block_size, block_multiplier)
        n = m.num_reqs
        found = portable.plan_step(
            m.query_start_loc[: n + 1],
            m.query_start_loc_cpu[: n + 1],
            m.seq_lens[:n],
            m.block_table_tensor[:n] * block_multiplier,
            index.slot_mapping,
            num_decodes=self.decode.block_table.shape[0] if self.decode else 0,
            num_actual_tokens=self.num_actual_tokens,
            max_seq_len=m.max_seq_len,
            block_size=block_size,
        )
        self._portable[key] = found
        return found

    def index(self, block_size: int, block_multiplier: int) -> PagedIndex:
        """Slots and block tables for caches whose block ``b`` is ``b * multiplier``;
        computed once per step, by the first layer that asks."""
        key = (block_size, block_multiplier)
        found = self._index.get(key)
        if found is not None:
            return found
        decode_bt = self.decode.block_table if self.decode else None
        prefill_bt = self.prefill.block_table if self.prefill else None
        slots = self.slot_mapping
        if block_multiplier != 1:
            extra = (block_multiplier - 1) * block_size
            slots = torch.where(
                slots >= 0, slots + (slots // block_size) * extra, slots
            )
            decode_bt = decode_bt * block_multiplier if decode_bt is not None else None
            prefill_bt = (
                prefill_bt * block_multiplier if prefill_bt is not None else None
            )
        found = PagedIndex(slots, decode_bt, prefill_bt)
        self._index[key] = found
        return found


def build_metadata(m: CommonAttentionMetadata) -> KunlunAttentionMetadata:
    """Plan one engine step; requests with one new token (decodes) come first."""
    num_reqs = m.num_reqs
    num_decodes, num_prefills, num_decode_tokens, _ = split_decodes_and_prefills(
        m, decode_threshold=1
    )
    q_loc_cpu = m.query_start_loc_cpu[: num_reqs + 1]
    q_loc = m.query_start_loc[: num_reqs + 1]
    num_tokens = int(q_loc_cpu[-1])
    seq_lens = m.seq_lens[:num_reqs]
    seq_cpu = m._seq_lens_cpu
    seq_lens_cpu = (seq_lens.cpu() if seq_cpu is None else seq_cpu)[:num_reqs]
    block_table = m.block_table_tensor[:num_reqs]
    i32 = torch.int32

    decode = None
    if num_decodes:
        decode = DecodeMetadata(
            block_table[:num_decodes],
            seq_lens[:num_decodes].to(i32),
            seq_lens_cpu[:num_decodes].to(i32),
        )
    prefill = None
    if num_prefills:
        d = num_decodes
        q_lod_cpu = (q_loc_cpu[d:] - q_loc_cpu[d]).to(i32)
        kv_cpu = seq_lens_cpu[d:].to(i32)
        kv_lod_cpu = torch.zeros(num_prefills + 1, dtype=i32)
        kv_lod_cpu[1:] = torch.cumsum(kv_cpu, 0)
        kv_lod = torch.zeros(num_prefills + 1, dtype=i32, device=seq_lens.device)
        kv_lod[1:] = torch.cumsum(seq_lens[d:], 0)
        prefill = PrefillMetadata(
            block_table=block_table[d:],
            q_lod=(q_loc[d:] - q_loc[d]).to(i32),
            q_lod_cpu=q_lod_cpu,
            kv_lod=kv_lod,
            kv_lod_cpu=kv_lod_cpu,
            has_context=bool((kv_cpu != q_lod_cpu.diff()).any()),
        )
    return KunlunAttentionMetadata(
        num_actual_tokens=num_tokens,
        num_decode_tokens=num_decode_tokens,
        slot_mapping=m.slot_mapping[:num_tokens],
        decode=decode,
        prefill=prefill,
        common=m,
    )


def kv_views(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(key cache, value cache, block multiplier), both contiguous BHLD tensors.

    The plain layout gives ``kv_cache[0]`` / ``kv_cache[1]``. vLLM's hybrid layout
    (``_update_hybrid_attention_mamba_layout``) interleaves the K and V pages of each
    block; read as one contiguous run of ``2 * num_blocks`` pages, K of block ``b`` is
    page ``2b`` and V of block ``b`` is page ``2b`` of the run starting one page later.
    """
    key_cache, value_cache = kv_cache[0], kv_cache[1]
    if key_cache.is_contiguous() and value_cache.is_contiguous():
        return key_cache, value_cache, 1
    _, num_blocks, *page_shape = kv_cache.shape
    page = math.prod(page_shape)
    pages = torch.empty(2 * num_blocks, *page_shape, device="meta").stride()
    if kv_cache.stride() == (page, 2 * page, *pages[1:]):
        run = torch.as_strided(
            kv_cache,
            (2 * num_blocks, *page_shape),
            pages,
            kv_cache.storage_offset(),
        )
        return run, run[1:], 2
    raise ValueError(
        f"{DISPLAY_NAME}: unexpected KV cache layout, shape {tuple(kv_cache.shape)} "
        f"strides {kv_cache.stride()}; expected contiguous [2, blocks, heads, block, "
        "dim] halves or vLLM's hybrid block-interleaved layout"
    )


class KunlunAttentionMetadataBuilder(
    DecodesFirstMetadataBuilder[KunlunAttentionMetadata]
):
    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> KunlunAttentionMetadata:
        return build_metadata(common_attn_metadata)


class KunlunAttentionImpl(PluginAttentionImpl[KunlunAttentionMetadata]):
    DISPLAY_NAME = DISPLAY_NAME
    WHY: ClassVar[dict[str, str]] = {
        "attn_type": "the kernels are causal decoder kernels",
        "alibi": "kunlun_ops.paged_attention takes no slopes",
        "kv_cache_dtype": "not a kernel layout",
    }

    @classmethod
    def refusal(cls, what: str, why: str) -> NotImplementedError:
        return NotImplementedError(f"{DISPLAY_NAME} cannot serve {what}: {why}. {FIX}")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        head_size, scale = self.head_size, self.scale
        # What the vendor call forms cannot take sends the layer to the portable kernel.
        portable_why = [
            why
            for why, needed in (
                (
                    f"sliding window {self.sliding_window} "
                    "(kunlun_ops.paged_attention takes no window)",
                    self.sliding_window is not None,
                ),
                (
                    f"logit soft-capping {self.logits_soft_cap} "
                    "(no kunlun_ops call form takes a cap)",
                    bool(self.logits_soft_cap),
                ),
                (
                    "attention sinks (kunlun_ops.paged_attention takes none)",
                    self.sinks is not None,
                ),
            )
            if needed
        ]
        self.portable_reason = "; ".join(portable_why) or None
        if head_size not in SUPPORTED_HEAD_SIZES:
            raise self.refusal(
                f"head size {head_size}", f"kernels take {SUPPORTED_HEAD_SIZES}"
            )
        if not math.isclose(scale, head_size**-0.5, rel_tol=1e-6):
            raise self.refusal(
                f"softmax scale {scale}",
                f"the kernels scale by 1/sqrt(head_size) = {head_size**-0.5:.6g}",
            )
        self.route = Route("attention", ops.ATTENTION_KERNELS, family=chooser.ATTENTION)
        if not self.route.ready:
            raise RuntimeError(
                f"{DISPLAY_NAME} was selected but its kernels are unavailable: "
                f"{self.route.reason}. {FIX}"
            )
        logger.info_once("vllm-kunlun: attention served by %s", DISPLAY_NAME)
        if self.portable_reason:
            self.route.reasons.add(f"portable kernel: {self.portable_reason}")
            logger.info_once(
                "vllm-kunlun: attention layers with %s run on the portable kernel "
                "(paged_portable.py) over the Kunlun cache; the other layers on "
                "kunlun_ops",
                self.portable_reason,
            )

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: KunlunAttentionMetadata,
        output: torch.Tensor,
    ) -> torch.Tensor:
        k = self.route.kernels
        md = attn_metadata
        n, nd = md.num_actual_tokens, md.num_decode_tokens
        key_cache, value_cache, multiplier = kv_views(kv_cache)
        index = md.index(key_cache.shape[2], multiplier)
        new_kv = self.kv_sharing_target_layer_name is None and key is not None
        if new_kv:
            ops.write_kv_cache(
                k, key[:n], value[:n], key_cache, value_cache, index.slot_mapping
            )
        if self.portable_reason:
            self.route.native_calls += 1
            return portable.attend(
                query,
                key_cache,
                value_cache,
                md.portable_plan(key_cache.shape[2], multiplier),
                output,
                self.scale,
                self.logits_soft_cap,
                window=self.sliding_window,
                sinks=self.sinks,
                heads_first=True,
            )
        q = query[:n].contiguous()
        if md.decode is not None:
            ops.decode(
                k,
                q[:nd],
                key_cache,
                value_cache,
                index.decode_block_table,  # type: ignore[arg-type]
                md.decode.seq_lens,
                md.decode.seq_lens_cpu,
                output[:nd],
            )
        p = md.prefill
        if p is not None:
            if new_kv and not p.has_context:
                ops.prefill_new_tokens(
                    k,
                    q[nd:],
                    key[nd:n],
                    value[nd:n],
                    p.q_lod,
                    p.q_lod_cpu,
                    output[nd:n],
                )
            else:
                ops.prefill_paged(
                    k,
                    q[nd:],
                    key_cache,
                    value_cache,
                    index.prefill_block_table,  # type: ignore[arg-type]
                    p.q_lod,
                    p.q_lod_cpu,
                    p.kv_lod,
                    p.kv_lod_cpu,
                    output[nd:n],
                )
        self.route.vendor_calls += 1
        return output


class KunlunAttentionBackend(PluginAttentionBackend):
    # float32 (accepted) is what host emulation runs; on a P800 models run in bfloat16.
    IMPL = KunlunAttentionImpl
    BUILDER = KunlunAttentionMetadataBuilder
    KV_CACHE_LAYOUT = (2, "num_blocks", "num_kv_heads", "block_size", "head_size")

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int | MultipleOf]:
        return [MultipleOf(KERNEL_BLOCK_ALIGNMENT)]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(SUPPORTED_HEAD_SIZES)
