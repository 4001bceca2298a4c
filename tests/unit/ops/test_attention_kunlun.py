"""The Kunlun attention backend through the fake kernels, against torch's SDPA.

Random engine steps mix decodes, fresh prefills, prefill chunks over cached context
(chunked prefill) and prefix-cache hits, with GQA and shuffled physical blocks; the
context is placed in the BHLD cache the way the kernels address it. The reference is
``torch.nn.functional.scaled_dot_product_attention`` over each request's whole sequence.
Then the layouts (vLLM's hybrid block-interleaved cache), selection and refusals.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from vllm.v1.attention.backend import (
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig

from vllm_kunlun.ops import chooser, routes
from vllm_kunlun.ops.attention import block_sizes
from vllm_kunlun.ops.attention import select as attention
from vllm_kunlun.ops.attention.kunlun import (
    BACKEND_PATH,
    KunlunAttentionBackend,
    KunlunAttentionImpl,
    build_metadata,
    kv_views,
)
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform
from vllm_kunlun.platforms.kunlun import KunlunPlatform

HEADS, KV_HEADS, HEAD = 8, 2, 128


@pytest.fixture
def fake_ops(fake_vendor_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    import kunlun_ops

    kunlun_ops.reset()
    routes.forget_routes()
    monkeypatch.setattr(chooser, "vendor_policy", lambda: (True, "test"))
    yield kunlun_ops
    routes.forget_routes()


@dataclass
class Step:
    common: CommonAttentionMetadata
    query: torch.Tensor  # [T, H, D]
    key: torch.Tensor  # [T, KH, D] the new tokens'
    value: torch.Tensor
    kv_cache: torch.Tensor
    full_k: list[torch.Tensor]  # per request, the whole sequence
    full_v: list[torch.Tensor]
    rows: list[tuple[int, int]]  # token rows of each request
    slots: torch.Tensor


def make_step(
    context_lens: list[int],
    query_lens: list[int],
    *,
    dtype: torch.dtype = torch.float32,
    block_size: int = 16,
    hybrid: bool = False,
    seed: int = 0,
    device: str = "cpu",
) -> Step:
    """Decodes (query_len 1) must come first, as vLLM orders them for this backend."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in zip(context_lens, query_lens, strict=True)]
    blocks_per_req = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_req) + 2
    physical = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.zeros(len(seq_lens), max(blocks_per_req), dtype=torch.int32)
    for r, n in enumerate(blocks_per_req):
        table[r, :n] = torch.tensor([physical.pop() for _ in range(n)])

    shape = KunlunAttentionBackend.get_kv_cache_shape(
        num_blocks, block_size, KV_HEADS, HEAD
    )
    kv_cache = torch.zeros(shape, dtype=dtype)
    if hybrid:  # what vLLM's _update_hybrid_attention_mamba_layout does to it
        page = kv_cache.shape[2:].numel()
        kv_cache.as_strided_(kv_cache.shape, (page, 2 * page, *kv_cache.stride()[2:]))

    def rand(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=gen).to(dtype)

    full_k, full_v, qs, ks, vs, slots, rows = [], [], [], [], [], [], []
    start = 0
    for r, (ctx, q_len) in enumerate(zip(context_lens, query_lens, strict=True)):
        s = ctx + q_len
        k, v = rand(s, KV_HEADS, HEAD), rand(s, KV_HEADS, HEAD)
        full_k.append(k)
        full_v.append(v)
        for i in range(s):  # token i of request r: block table[i // bs], offset i % bs
            block, offset = int(table[r, i // block_size]), i % block_size
            if i < ctx:  # the context is already cached (earlier steps, prefix hit)
                kv_cache[0, block, :, offset] = k[i]
                kv_cache[1, block, :, offset] = v[i]
            else:
                slots.append(block * block_size + offset)
        qs.append(rand(q_len, HEADS, HEAD))
        ks.append(k[ctx:])
        vs.append(v[ctx:])
        rows.append((start, start + q_len))
        start += q_len
    q_loc = torch.tensor([0] + [e for _, e in rows], dtype=torch.int32)
    on = torch.device(device)
    common = CommonAttentionMetadata(
        query_start_loc=q_loc.to(on),
        query_start_loc_cpu=q_loc,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=on),
        num_reqs=len(seq_lens),
        num_actual_tokens=start,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=table.to(on),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=on),
        _seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32),
    )
    if hybrid:  # keep vLLM's re-strided layout on the device
        kv_cache = torch.empty_strided(
            kv_cache.shape, kv_cache.stride(), dtype=dtype, device=on
        ).copy_(kv_cache)
    else:
        kv_cache = kv_cache.to(on)
    return Step(
        common,
        torch.cat(qs).to(on),
        torch.cat(ks).to(on),
        torch.cat(vs).to(on),
        kv_cache,
        full_k,
        full_v,
        rows,
        torch.tensor(slots),
    )


def reference(step: Step) -> torch.Tensor:
    """SDPA per request: its queries are the last positions of its sequence."""
    out = []
    for r, (s, e) in enumerate(step.rows):
        q = step.query[s:e].float().cpu().transpose(0, 1)  # [H, Q, D]
        k = step.full_k[r].float().repeat_interleave(HEADS // KV_HEADS, 1)
        v = step.full_v[r].float().repeat_interleave(HEADS // KV_HEADS, 1)
        length, n = k.shape[0], e - s
        mask = torch.ones(n, length, dtype=torch.bool).tril(diagonal=length - n)
        o = F.scaled_dot_product_attention(
            q, k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
        )
        out.append(o.transpose(0, 1))
    return torch.cat(out)


def run_layer(step: Step, **impl_kwargs: Any) -> torch.Tensor:
    impl = KunlunAttentionImpl(HEADS, HEAD, HEAD**-0.5, KV_HEADS, **impl_kwargs)
    output = torch.full_like(step.query, float("nan"))
    key = None if impl_kwargs.get("kv_sharing_target_layer_name") else step.key
    value = None if key is None else step.value
    impl.forward(
        None,  # type: ignore[arg-type]
        step.query,
        key,  # type: ignore[arg-type]
        value,  # type: ignore[arg-type]
        step.kv_cache,
        build_metadata(step.common),
        output=output,
    )
    return output


MIXED = ([5, 17, 0, 0, 32, 3, 40], [1, 1, 1, 9, 7, 12, 20])  # decodes, then prefills


CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.device,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    ],
)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hybrid", [False, True])
def test_mixed_step_matches_sdpa(
    fake_ops: Any, dtype: torch.dtype, hybrid: bool, device: str
) -> None:
    step = make_step(*MIXED, dtype=dtype, hybrid=hybrid, seed=1, device=device)
    out = run_layer(step).cpu()
    tol = (
        {"atol": 1e-5, "rtol": 1e-5}
        if dtype == torch.float32
        else {"atol": 2e-2, "rtol": 2e-2}
    )
    torch.testing.assert_close(out.float(), reference(step), **tol)
    calls = [(c.name, c.args.get("is_prefix_cache")) for c in fake_ops.CALLS]
    assert calls == [
        ("reshape_and_cache_flash", None),
        ("paged_attention", None),
        ("prefill_attention", True),  # chunks over context and prefix hits
    ]


def test_new_tokens_land_in_their_slots(fake_ops: Any) -> None:
    step = make_step(*MIXED, seed=2)
    run_layer(step)
    block_size = step.kv_cache.shape[3]
    new_k = torch.cat(
        [k[-(e - s) :] for k, (s, e) in zip(step.full_k, step.rows, strict=True)]
    )
    for i, slot in enumerate(step.slots.tolist()):
        block, offset = divmod(slot, block_size)
        torch.testing.assert_close(step.kv_cache[0, block, :, offset], new_k[i])


def test_fresh_prefills_attend_within_the_new_tokens(fake_ops: Any) -> None:
    step = make_step([3, 0, 0], [1, 6, 19], seed=3)
    torch.testing.assert_close(run_layer(step), reference(step))
    forms = [
        c.args.get("is_prefix_cache")
        for c in fake_ops.CALLS
        if c.name == "prefill_attention"
    ]
    assert forms == [False]


def test_prefill_only_and_decode_only_steps(fake_ops: Any) -> None:
    for lens in (([0, 16, 5], [4, 16, 30]), ([7, 1, 60], [1, 1, 1])):
        step = make_step(*lens, seed=4)
        torch.testing.assert_close(run_layer(step), reference(step))


def test_padded_slots_are_not_written(fake_ops: Any) -> None:
    step = make_step([2], [3], seed=5)
    step.common.slot_mapping[1] = -1  # vLLM's PAD_SLOT_ID
    before = step.kv_cache.clone()
    run_layer(step)
    changed = (step.kv_cache != before).any(dim=(-1, -2)).sum().item()
    assert changed == 2 * 2  # K and V of the two written tokens


def test_kv_sharing_layer_reads_the_cache_without_writing(fake_ops: Any) -> None:
    step = make_step([0, 9], [4, 3], seed=6)
    for r, (s, e) in enumerate(step.rows):  # the target layer wrote these already
        ctx = step.full_k[r].shape[0] - (e - s)
        for i, slot in enumerate(step.slots.tolist()[s:e]):
            block, offset = divmod(slot, step.kv_cache.shape[3])
            step.kv_cache[0, block, :, offset] = step.full_k[r][ctx + i]
            step.kv_cache[1, block, :, offset] = step.full_v[r][ctx + i]
    out = run_layer(step, kv_sharing_target_layer_name="model.layers.0.attn")
    torch.testing.assert_close(out, reference(step))
    assert [c.name for c in fake_ops.CALLS] == ["prefill_attention"]


def test_warm_up_run_writes_nothing(fake_ops: Any) -> None:
    impl = KunlunAttentionImpl(HEADS, HEAD, HEAD**-0.5, KV_HEADS)
    out = torch.full((3, HEADS, HEAD), float("nan"))
    q = torch.randn(3, HEADS, HEAD)
    result = impl.forward(None, q, q, q, torch.zeros(2, 1), None, output=out)  # type: ignore[arg-type]
    assert result is out and torch.equal(out, torch.zeros_like(out))
    assert fake_ops.CALLS == []


def dense_reference(
    step: Step,
    window: int | None = None,
    soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per request in float64, masked by hand: key ``j`` is seen by the query at
    ``p`` when ``j <= p`` and ``j > p - window``; the sink is one more logit per head."""
    out = []
    for r, (s, e) in enumerate(step.rows):
        q = step.query[s:e].double().cpu()  # [Q, H, D]
        k = step.full_k[r].double().repeat_interleave(HEADS // KV_HEADS, 1)
        v = step.full_v[r].double().repeat_interleave(HEADS // KV_HEADS, 1)
        scores = torch.einsum("qhd,shd->hqs", q, k) * HEAD**-0.5
        if soft_cap:
            scores = soft_cap * torch.tanh(scores / soft_cap)
        q_pos = k.shape[0] - (e - s) + torch.arange(e - s)[:, None]
        k_pos = torch.arange(k.shape[0])[None, :]
        allowed = k_pos <= q_pos
        if window is not None:
            allowed &= k_pos > q_pos - window
        scores = scores.masked_fill(~allowed, float("-inf"))
        if sinks is None:
            probs = scores.softmax(-1)
        else:
            sink = sinks.double()[:, None, None].expand(-1, e - s, 1)
            probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
        out.append(torch.einsum("hqs,shd->qhd", probs, v))
    return torch.cat(out)


FEATURES = [
    {"sliding_window": 6},
    {"sliding_window": 19},
    {"logits_soft_cap": 3.0},
    {"sinks": torch.linspace(-2.0, 2.0, HEADS)},
    {"sliding_window": 10, "sinks": torch.linspace(1.0, -1.0, HEADS)},
]


@pytest.mark.parametrize("hybrid", [False, True])
@pytest.mark.parametrize("features", FEATURES)
def test_window_cap_and_sink_layers_run_the_portable_kernel_over_the_kunlun_cache(
    fake_ops: Any, features: dict, hybrid: bool
) -> None:
    step = make_step(*MIXED, hybrid=hybrid, seed=7)
    out = run_layer(step, **features)
    expected = dense_reference(
        step,
        window=features.get("sliding_window"),
        soft_cap=features.get("logits_soft_cap"),
        sinks=features.get("sinks"),
    )
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    # The feature matters here (a kernel ignoring it would fail the check above).
    assert not torch.allclose(expected, dense_reference(step), atol=1e-3)
    # The cache write stays on the vendor kernel; attention does not.
    assert [c.name for c in fake_ops.CALLS] == ["reshape_and_cache_flash"]
    status = routes.status()["attention"]
    assert status["native_calls"] == 1 and status["vendor_calls"] == 0
    assert any("portable kernel" in r for r in status["native_reasons"])


def test_hybrid_views_are_contiguous_and_address_the_right_pages() -> None:
    kv = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 3, 1, 4, 1).clone()
    page = 4
    kv.as_strided_(kv.shape, (page, 2 * page, *kv.stride()[2:]))
    k_cache, v_cache, mult = kv_views(kv)
    assert mult == 2 and k_cache.is_contiguous() and v_cache.is_contiguous()
    for b in range(3):
        assert torch.equal(k_cache[2 * b], kv[0, b]) and torch.equal(
            v_cache[2 * b], kv[1, b]
        )
    with pytest.raises(ValueError, match="unexpected KV cache layout"):
        kv_views(torch.zeros(2, 3, 4, 2, 2).transpose(2, 3))  # block, heads swapped


# ---- refusals and selection ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [
        ({"alibi_slopes": [0.5] * HEADS}, "ALiBi"),
        ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype"),
        ({"attn_type": AttentionType.ENCODER_ONLY}, "encoder_only"),
        ({"scale": 0.0625}, "softmax scale"),
        ({"head_size": 48, "scale": 48**-0.5}, "head size 48"),
    ],
)
def test_impl_refuses_what_the_kernels_cannot_do(
    fake_ops: Any, kwargs: dict, what: str
) -> None:
    args: dict = {
        "num_heads": HEADS,
        "head_size": HEAD,
        "scale": HEAD**-0.5,
        "num_kv_heads": KV_HEADS,
    }
    with pytest.raises(NotImplementedError, match=f"cannot serve.*{what}.*TRITON_ATTN"):
        KunlunAttentionImpl(**{**args, **kwargs})


def selector(**kw: Any) -> AttentionSelectorConfig:
    base: dict = {
        "head_size": HEAD,
        "dtype": torch.bfloat16,
        "kv_cache_dtype": "auto",
        "block_size": 16,
    }
    return AttentionSelectorConfig(**{**base, **kw})


@pytest.fixture
def clean_custom_slot() -> Iterator[None]:
    AttentionBackendEnum.CUSTOM.clear_override()
    yield
    AttentionBackendEnum.CUSTOM.clear_override()


def test_kunlun_defaults_to_the_vendor_backend_when_the_kernels_exist(
    fake_ops: Any, clean_custom_slot: None
) -> None:
    assert KunlunPlatform.get_attn_backend_cls(None, selector()) == BACKEND_PATH
    # The name maps back to vLLM's enum; explicit choices stay what they were.
    assert (
        AttentionBackendEnum[KunlunAttentionBackend.get_name()]
        is AttentionBackendEnum.CUSTOM
    )
    triton = AttentionBackendEnum.TRITON_ATTN
    assert KunlunPlatform.get_attn_backend_cls(triton, selector()) == triton.get_path()
    assert (
        KunlunPlatform.get_attn_backend_cls(AttentionBackendEnum.CUSTOM, selector())
        == attention.PORTABLE_BACKEND_PATH
    )


def test_kunlun_serves_encoder_only_layers_on_the_portable_backend(
    fake_ops: Any, clean_custom_slot: None
) -> None:
    # The vendor kernels are causal and paged; the reason is logged once.
    sel = selector(attn_type=AttentionType.ENCODER_ONLY)
    assert attention.select_kunlun(sel)[0] is None
    assert KunlunPlatform.get_attn_backend_cls(None, sel) == (
        attention.PORTABLE_BACKEND_PATH
    )


def test_kunlun_falls_back_to_triton_with_the_reason(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    triton = AttentionBackendEnum.TRITON_ATTN.get_path()
    # A layer the backend cannot serve.
    fp8 = selector(kv_cache_dtype="fp8")
    assert KunlunPlatform.get_attn_backend_cls(None, fp8) == triton
    assert "kv_cache_dtype not supported" in attention.select_kunlun(fp8)[1]
    # Sinks it serves (on the portable kernel, see below).
    assert attention.select_kunlun(selector(has_sink=True))[0] == BACKEND_PATH
    # A vendor library without the kernels.
    monkeypatch.delattr(fake_ops, "prefill_attention")
    assert KunlunPlatform.get_attn_backend_cls(None, selector()) == triton
    assert attention.select_kunlun(selector()) == (
        None,
        "kunlun_ops (0.1.58) has no prefill_attention (the validated kunlun_ops "
        "0.1.58 has it)",
    )


def test_emulation_takes_the_vendor_backend_only_with_the_switch(
    fake_ops: Any, monkeypatch: pytest.MonkeyPatch, clean_custom_slot: None
) -> None:
    sel = selector(dtype=torch.float32, head_size=32)
    monkeypatch.delenv("VLLM_KUNLUN_EMULATION_VENDOR", raising=False)
    plat = KunlunHostEmulationPlatform
    assert plat.get_attn_backend_cls(None, sel) == attention.PORTABLE_BACKEND_PATH
    monkeypatch.setenv("VLLM_KUNLUN_EMULATION_VENDOR", "1")
    assert plat.get_attn_backend_cls(None, sel) == BACKEND_PATH
    assert (
        plat.get_attn_backend_cls(AttentionBackendEnum.CUSTOM, sel)
        == attention.PORTABLE_BACKEND_PATH
    )


# ---- page sizes of hybrid models ---------------------------------------------------
# vLLM pads a hybrid's attention page to a multiple of 16 tokens that holds one GDN
# state: 48 for a narrow GDN, 400 for the log's 27B at TP 8, 544 for others. None is in
# vLLM's literal BlockSize list.
HYBRID_PAGES = [48, 400, 544]


@pytest.mark.parametrize("block_size", [16, *HYBRID_PAGES])
def test_kunlun_serves_every_hybrid_page_on_the_vendor_kernels(
    fake_ops: Any, clean_custom_slot: None, block_size: int
) -> None:
    # The log's attention layer: head_dim 256 (24 query / 4 KV heads), bfloat16.
    sel = selector(head_size=256, block_size=block_size)
    assert KunlunPlatform.get_attn_backend_cls(None, sel) == BACKEND_PATH
    # vLLM's model runner keeps the page as the kernel block (no split).
    assert (
        block_sizes.kernel_block_size(KunlunAttentionBackend, block_size) == block_size
    )


@pytest.mark.parametrize("block_size", [16, *HYBRID_PAGES])
def test_emulation_vendor_path_serves_every_hybrid_page(
    fake_ops: Any,
    monkeypatch: pytest.MonkeyPatch,
    clean_custom_slot: None,
    block_size: int,
) -> None:
    sel = selector(dtype=torch.float32, head_size=32, block_size=block_size)
    plat = KunlunHostEmulationPlatform
    monkeypatch.setenv("VLLM_KUNLUN_EMULATION_VENDOR", "1")
    assert plat.get_attn_backend_cls(None, sel) == BACKEND_PATH
    monkeypatch.delenv("VLLM_KUNLUN_EMULATION_VENDOR")
    assert plat.get_attn_backend_cls(None, sel) == attention.PORTABLE_BACKEND_PATH


def test_a_page_outside_the_kernel_blocks_falls_back_naming_size_and_reason(
    fake_ops: Any, clean_custom_slot: None
) -> None:
    sel = selector(head_size=256, block_size=8)
    path, why = attention.select_kunlun(sel)
    assert path is None
    assert "attention block size 8 cannot be split into its kernel blocks" in why
    assert "multiples of 16" in why
    triton = AttentionBackendEnum.TRITON_ATTN.get_path()
    assert KunlunPlatform.get_attn_backend_cls(None, sel) == triton


@pytest.mark.parametrize(
    "declared",
    [
        lambda: [MultipleOf(1)],
        lambda: [MultipleOf(16)],
        lambda: [16],
        lambda: [32, 64],
        lambda: [16, MultipleOf(48)],
        lambda: [],
    ],
)
def test_kernel_block_size_is_vllms_choice(declared: Any) -> None:
    """Our answer agrees with vLLM's own GPUModelRunner.select_common_block_size for
    one backend, at every page size vLLM can pick (and some it cannot)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    class Backend:
        @staticmethod
        def get_supported_kernel_block_sizes() -> list:
            return declared()

    group = SimpleNamespace(backend=Backend)
    for block in [1, 8, 16, 24, 32, 48, 64, 96, 400, 544, 1000]:
        try:
            expected: int | None = GPUModelRunner.select_common_block_size(
                block, [group]
            )
        except ValueError:
            expected = None
        if not declared():
            expected = block  # vLLM: an empty list supports every size
        assert block_sizes.kernel_block_size(Backend, block) == expected, block


def test_portable_backend_runs_every_page_unsplit() -> None:
    from vllm_kunlun.ops.attention.backend import PortableAttentionBackend

    for block in [1, 8, 16, 48, 400, 544, 1000]:
        assert PortableAttentionBackend.supports_block_size(block)
        assert block_sizes.kernel_block_size(PortableAttentionBackend, block) == block
    assert block_sizes.block_size_reason(PortableAttentionBackend, 400) is None
