"""vLLM's MoE layer on the plugin's kernels (ops/moe/routing.py, fused_moe_method.py).

Routing against vLLM's own torch routing (``cpu_fused_moe.select_experts`` /
``grouped_topk``, what vLLM runs on CPU) and against transformers' GLM-4.5 router; the
whole routed block (vLLM's layer attributes -> experts_forward) against transformers'
Qwen3-MoE and Mixtral sparse blocks; expert-parallel slices, activations, biases and
weight-on-input against vLLM's definitions or a float64 loop; the refusals.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from vllm.model_executor.layers.fused_moe import cpu_fused_moe

from vllm_kunlun.ops.moe import fused_moe_method, routing, routing_vendor

# (experts, top_k, tokens)
ROUTING_SHAPES = [(8, 2, 1), (16, 4, 7), (64, 8, 33), (128, 8, 5)]


def _logits(experts: int, tokens: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return 3.0 * torch.randn(tokens, experts, generator=gen)


def _same_choice(
    got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """Same (expert, weight) pairs per token, in any order within the token."""
    gw, gi = got
    ww, wi = want
    go, wo = gi.argsort(dim=-1), wi.to(torch.int64).argsort(dim=-1)
    assert torch.equal(gi.gather(1, go), wi.to(torch.int64).gather(1, wo))
    torch.testing.assert_close(gw.gather(1, go), ww.float().gather(1, wo))
    assert gw.dtype == torch.float32 and gi.dtype == torch.int64


@pytest.mark.parametrize(("experts", "top_k", "tokens"), ROUTING_SHAPES)
@pytest.mark.parametrize("renormalize", [True, False])
def test_softmax_topk_matches_vllms_cpu_routing(
    experts: int, top_k: int, tokens: int, renormalize: bool
) -> None:
    logits = _logits(experts, tokens, experts + tokens)
    x = torch.zeros(tokens, 4)
    got = routing.select_experts(
        x, logits, routing.Routing(top_k=top_k, renormalize=renormalize)
    )
    want = cpu_fused_moe.select_experts(
        x, logits, top_k, use_grouped_topk=False, renormalize=renormalize
    )
    _same_choice(got, want)


@pytest.mark.parametrize(("experts", "top_k", "tokens"), ROUTING_SHAPES[1:])
@pytest.mark.parametrize(
    ("scoring", "groups", "topk_group", "bias", "scale"),
    [
        ("softmax", 4, 2, False, 1.0),
        ("sigmoid", 8, 4, True, 2.5),  # DeepSeek-V3's
        ("sigmoid", 1, 1, True, 1.0),  # GLM-4.5's (one group)
    ],
)
def test_grouped_topk_matches_vllms_cpu_routing(
    experts: int,
    top_k: int,
    tokens: int,
    scoring: str,
    groups: int,
    topk_group: int,
    bias: bool,
    scale: float,
) -> None:
    if top_k > experts // groups * topk_group:
        pytest.skip("fewer experts in the kept groups than top_k")
    logits = _logits(experts, tokens, tokens)
    correction = 0.3 * torch.randn(experts) if bias else None
    x = torch.zeros(tokens, 4)
    r = routing.Routing(
        top_k=top_k,
        use_grouped_topk=True,
        num_expert_group=groups,
        topk_group=topk_group,
        scoring_func=scoring,
        routed_scaling_factor=scale,
    )
    got = routing.select_experts(x, logits, r, correction)
    want = cpu_fused_moe.select_experts(
        x,
        logits,
        top_k,
        use_grouped_topk=True,
        renormalize=True,
        topk_group=topk_group,
        num_expert_group=groups,
        scoring_func=scoring,
        routed_scaling_factor=scale,
        e_score_correction_bias=correction,
    )
    _same_choice(got, want)


@pytest.mark.parametrize(("groups", "topk_group"), [(1, 1), (4, 2), (8, 3)])
def test_grouped_sigmoid_routing_matches_transformers_glm4_moe(
    groups: int, topk_group: int
) -> None:
    from transformers import Glm4MoeConfig
    from transformers.models.glm4_moe import modeling_glm4_moe as hf

    cfg = Glm4MoeConfig(
        hidden_size=32,
        moe_intermediate_size=16,
        n_routed_experts=32,
        num_experts_per_tok=4,
        n_group=groups,
        topk_group=topk_group,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
    )
    block = hf.Glm4MoeMoE(cfg)
    # Positive biases: transformers masks dropped groups with 0, vLLM with -inf.
    block.gate.e_score_correction_bias.copy_(0.3 * torch.rand(32))
    logits = _logits(32, 17, groups)
    want_ids, want_w = block.route_tokens_to_experts(logits)
    r = routing.Routing(
        top_k=4,
        use_grouped_topk=True,
        num_expert_group=groups,
        topk_group=topk_group,
        scoring_func="sigmoid",
        routed_scaling_factor=2.5,
    )
    got = routing.select_experts(
        torch.zeros(17, 4), logits, r, block.gate.e_score_correction_bias
    )
    _same_choice(got, (want_w, want_ids))


def test_custom_routing_function_is_called_as_vllm_calls_it() -> None:
    seen: dict[str, Any] = {}

    def custom(**kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
        seen.update(kw)
        return torch.ones(3, 1, dtype=torch.float16), torch.zeros(
            3, 1, dtype=torch.int32
        )

    x, logits = torch.zeros(3, 4), _logits(8, 3, 0)
    w, ids = routing.select_experts(
        x, logits, routing.Routing(top_k=1, custom_routing_function=custom)
    )
    assert set(seen) == {"hidden_states", "gating_output", "topk", "renormalize"}
    assert seen["gating_output"] is logits and seen["topk"] == 1
    assert w.dtype == torch.float32 and ids.dtype == torch.int64


# ---- the routed block ------------------------------------------------------------------


def _layer(**kw: Any) -> SimpleNamespace:
    base: dict[str, Any] = {
        "renormalize": True,
        "use_grouped_topk": False,
        "num_expert_group": None,
        "topk_group": None,
        "scoring_func": "softmax",
        "routed_scaling_factor": 1.0,
        "custom_routing_function": None,
        "e_score_correction_bias": None,
        "expert_map": None,
        "activation": "silu",
        "apply_router_weight_on_input": False,
    }
    return SimpleNamespace(**{**base, **kw})


# (experts, top_k, hidden, expert width, tokens)
BLOCK_SHAPES = [(8, 2, 32, 16, 1), (16, 4, 64, 48, 33), (64, 8, 32, 16, 7)]


@pytest.mark.parametrize(
    ("experts", "top_k", "hidden", "inter", "tokens"), BLOCK_SHAPES
)
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_routed_block_matches_transformers(
    family: str, experts: int, top_k: int, hidden: int, inter: int, tokens: int
) -> None:
    torch.manual_seed(experts + tokens)
    if family == "qwen3_moe":
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe import modeling_qwen3_moe as hf

        cfg: Any = Qwen3MoeConfig(
            hidden_size=hidden,
            moe_intermediate_size=inter,
            num_experts=experts,
            num_experts_per_tok=top_k,
            norm_topk_prob=False,  # vLLM's renormalize=False path
        )
        block: Any = hf.Qwen3MoeSparseMoeBlock(cfg)
        renormalize = False
    else:
        from transformers import MixtralConfig
        from transformers.models.mixtral import modeling_mixtral as hf

        cfg = MixtralConfig(
            hidden_size=hidden,
            intermediate_size=inter,
            num_local_experts=experts,
            num_experts_per_tok=top_k,
        )
        block = hf.MixtralSparseMoeBlock(cfg)
        renormalize = True
    cfg._experts_implementation = "eager"
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.5)
    x = torch.randn(tokens, hidden)
    want = block(x.unsqueeze(0))
    want = (want[0] if isinstance(want, tuple) else want).squeeze(0)
    layer = _layer(
        top_k=top_k,
        renormalize=renormalize,
        w13_weight=block.experts.gate_up_proj.data,
        w2_weight=block.experts.down_proj.data,
    )
    got = fused_moe_method.experts_forward(layer, x, F.linear(x, block.gate.weight))
    torch.testing.assert_close(got, want.detach(), atol=1e-4, rtol=1e-4)


def _reference(
    x: torch.Tensor,
    layer: SimpleNamespace,
    weights: torch.Tensor,
    ids: torch.Tensor,
    act: Any,
) -> torch.Tensor:
    """A float64 loop over (token, slot): the routed block's definition."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    w13, w2 = layer.w13_weight.double(), layer.w2_weight.double()
    b13 = getattr(layer, "w13_bias", None)
    b2 = getattr(layer, "w2_bias", None)
    for t in range(x.shape[0]):
        for s in range(ids.shape[1]):
            e, w = int(ids[t, s]), float(weights[t, s])
            xe = x[t].double() * (w if layer.apply_router_weight_on_input else 1.0)
            gu = w13[e] @ xe + (b13[e].double() if b13 is not None else 0)
            y = w2[e] @ act(gu) + (b2[e].double() if b2 is not None else 0)
            out[t] += y if layer.apply_router_weight_on_input else w * y
    return out


def _gelu_and_mul(gu: torch.Tensor) -> torch.Tensor:
    d = gu.shape[-1] // 2
    return F.gelu(gu[..., :d]) * gu[..., d:]


@pytest.mark.parametrize(
    ("activation", "act", "bias", "on_input", "top_k"),
    [
        ("gelu", _gelu_and_mul, False, False, 2),
        ("swigluoai", cpu_fused_moe._swigluoai_forward_native, True, False, 4),
        ("silu", lambda gu: F.silu(gu.chunk(2)[0]) * gu.chunk(2)[1], False, True, 1),
    ],
)
def test_activations_biases_and_weight_on_input(
    activation: str, act: Any, bias: bool, on_input: bool, top_k: int
) -> None:
    torch.manual_seed(3)
    experts, hidden, inter, tokens = 8, 16, 12, 9
    layer = _layer(
        top_k=top_k,
        activation=activation,
        apply_router_weight_on_input=on_input,
        w13_weight=0.5 * torch.randn(experts, 2 * inter, hidden),
        w2_weight=0.5 * torch.randn(experts, hidden, inter),
    )
    if bias:
        layer.w13_bias = torch.randn(experts, 2 * inter)
        layer.w2_bias = torch.randn(experts, hidden)
    x, logits = torch.randn(tokens, hidden), _logits(experts, tokens, 5)
    got = fused_moe_method.experts_forward(layer, x, logits)
    weights, ids = routing.select_experts(x, logits, routing.Routing(top_k=top_k))
    want = _reference(x, layer, weights, ids, act)
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("ranks", [2, 4])
def test_expert_parallel_slices_sum_to_the_whole_block(ranks: int) -> None:
    """Each rank holds a contiguous slice (vLLM's expert_map: global -> local, -1
    elsewhere); the ranks' outputs add up (the all-reduce) to the unsplit block."""
    torch.manual_seed(ranks)
    experts, hidden, inter, tokens = 16, 32, 16, 11
    w13 = torch.randn(experts, 2 * inter, hidden)
    w2 = torch.randn(experts, hidden, inter)
    x, logits = torch.randn(tokens, hidden), _logits(experts, tokens, 9)
    whole = fused_moe_method.experts_forward(
        _layer(top_k=4, w13_weight=w13, w2_weight=w2), x, logits
    )
    local = experts // ranks
    total = torch.zeros_like(whole)
    for rank in range(ranks):
        expert_map = torch.full((experts,), -1, dtype=torch.int32)
        expert_map[rank * local : (rank + 1) * local] = torch.arange(
            local, dtype=torch.int32
        )
        part = slice(rank * local, (rank + 1) * local)
        layer = _layer(
            top_k=4, w13_weight=w13[part], w2_weight=w2[part], expert_map=expert_map
        )
        total += fused_moe_method.experts_forward(layer, x, logits)
    torch.testing.assert_close(total, whole, atol=1e-4, rtol=1e-4)


# ---- refusals --------------------------------------------------------------------------


def _served_layer(**kw: Any) -> SimpleNamespace:
    method = object.__new__(fused_moe_method.KunlunUnquantizedFusedMoEMethod)
    base: dict[str, Any] = {
        "quant_method": method,
        "quant_config": None,
        "activation": "silu",
        "enable_eplb": False,
        "dp_size": 1,
        "pcp_size": 1,
        "layer_name": "model.layers.3.mlp.experts",
    }
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({}, None),
        ({"quant_method": object()}, "float (bf16/fp16) or W8A8-INT8"),
        ({"activation": "relu2_no_mul"}, "'relu2_no_mul'"),
        ({"enable_eplb": True}, "--enable-eplb"),
        ({"dp_size": 2}, "data parallel size 2"),
    ],
)
def test_refusal_names_the_cause_and_the_fix(change: dict, words: str | None) -> None:
    layer = _served_layer(**change)
    why = fused_moe_method.refusal(layer)
    if words is None:
        assert why is None
        return
    assert why is not None and words in why
    with pytest.raises(ValueError, match=r"model\.layers\.3\.mlp\.experts"):
        fused_moe_method.check_layer(layer)


# ---- vendor routing through the fakes ---------------------------------------------------


@pytest.fixture
def vendor_routing(
    fake_vendor_path: Any, monkeypatch: pytest.MonkeyPatch, kunlun_platform: object
) -> Any:
    """Host emulation asked for the vendor kernels, the fakes importable."""
    import kunlun_ops

    from tests.conftest import serve_platform
    from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform

    serve_platform(monkeypatch, KunlunHostEmulationPlatform)
    monkeypatch.setenv("VLLM_KUNLUN_EMULATION_VENDOR", "1")
    routing_vendor.reset()
    kunlun_ops.reset()
    yield kunlun_ops
    routing_vendor.reset()


@pytest.mark.parametrize(("experts", "top_k", "tokens"), ROUTING_SHAPES)
def test_vendor_softmax_topk_matches_vllms_routing(
    vendor_routing: Any, experts: int, top_k: int, tokens: int
) -> None:
    logits = _logits(experts, tokens, 11 + tokens)
    x = torch.zeros(tokens, 4)
    (w, ids), path = routing_vendor.select_experts(
        x, logits, routing.Routing(top_k=top_k)
    )
    assert path == "vendor"
    assert [c.name for c in vendor_routing.CALLS] == ["moe_softmax_topk_norm"]
    want = cpu_fused_moe.select_experts(
        x, logits, top_k, use_grouped_topk=False, renormalize=True
    )
    _same_choice((w, ids), want)


@pytest.mark.parametrize(("groups", "topk_group", "scale"), [(1, 1, 2.5), (4, 2, 1.0)])
def test_vendor_sigmoid_grouped_topk_matches_vllms_routing(
    vendor_routing: Any, groups: int, topk_group: int, scale: float
) -> None:
    experts, top_k, tokens = 32, 4, 9
    logits, bias = _logits(experts, tokens, groups), 0.3 * torch.randn(experts)
    x = torch.zeros(tokens, 4)
    r = routing.Routing(
        top_k=top_k,
        use_grouped_topk=True,
        num_expert_group=groups,
        topk_group=topk_group,
        scoring_func="sigmoid",
        routed_scaling_factor=scale,
    )
    (w, ids), path = routing_vendor.select_experts(x, logits, r, bias)
    assert path == "vendor"
    (call,) = vendor_routing.CALLS
    assert call.name == "moe_sigmoid_group_topk_norm"
    assert call.args["n_group"] == groups and call.args["scale"] == 1.0
    _same_choice((w, ids), routing.select_experts(x, logits, r, bias))


@pytest.mark.parametrize(
    "r",
    [
        routing.Routing(top_k=2, renormalize=False),
        routing.Routing(
            top_k=2, use_grouped_topk=True, num_expert_group=4, topk_group=2
        ),
    ],
    ids=["no-renormalize", "softmax-groups"],
)
def test_routings_no_vendor_kernel_computes_run_portable(
    vendor_routing: Any, r: routing.Routing
) -> None:
    logits, x = _logits(16, 5, 1), torch.zeros(5, 4)
    (w, ids), path = routing_vendor.select_experts(x, logits, r)
    assert path == "portable" and vendor_routing.CALLS == []
    _same_choice((w, ids), routing.select_experts(x, logits, r))


def test_vendor_routing_keywords_are_declared_in_the_contract(
    vendor_routing: Any,
) -> None:
    from vllm_kunlun.ops.contract import VENDOR_CONTRACT

    x, logits = torch.zeros(3, 4), _logits(8, 3, 2)
    grouped = routing.Routing(
        top_k=2,
        use_grouped_topk=True,
        num_expert_group=2,
        topk_group=1,
        scoring_func="sigmoid",
    )
    routing_vendor.select_experts(x, logits, grouped, torch.zeros(8))
    routing_vendor.select_experts(x, logits, routing.Routing(top_k=2))
    names = [c.name for c in vendor_routing.CALLS]
    assert names == ["moe_sigmoid_group_topk_norm", "moe_softmax_topk_norm"]
    for call in vendor_routing.CALLS:
        assert set(call.args) == set(VENDOR_CONTRACT["kunlun_ops"][call.name])


# ---- registration and the W8A8 method ---------------------------------------------------


def test_register_all_replaces_vllms_moe_classes_on_a_plugin_platform_only(
    monkeypatch: pytest.MonkeyPatch, emulation_platform: object
) -> None:
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.layers.fused_moe.layer import FusedMoE
    from vllm.model_executor.layers.fused_moe.shared_fused_moe import SharedFusedMoE

    from tests.conftest import serve_platform

    fused_moe_method.unregister_all()
    try:
        assert fused_moe_method.register_all() == [
            "UnquantizedFusedMoEMethod",
            "FusedMoE",
            "SharedFusedMoE",
        ]
        assert fused_moe_method.register_all() == []  # idempotent
        assert op_registry_oot["FusedMoE"] is fused_moe_method.KunlunFusedMoE
        assert (
            op_registry_oot["SharedFusedMoE"] is fused_moe_method.KunlunSharedFusedMoE
        )
        # vLLM's op names: custom_ops switches keep meaning what they say.
        assert fused_moe_method.KunlunFusedMoE.name == FusedMoE.name == "fused_moe"
        assert issubclass(fused_moe_method.KunlunSharedFusedMoE, SharedFusedMoE)
        assert (
            fused_moe_method.KunlunUnquantizedFusedMoEMethod.name
            == "unquantized_fused_moe"
        )
    finally:
        fused_moe_method.unregister_all()
    serve_platform(monkeypatch, object())  # vLLM's own platform: nothing replaced
    assert fused_moe_method.register_all() == []
    assert "FusedMoE" not in op_registry_oot


def _int8_method(cls: type) -> Any:
    method = object.__new__(cls)
    method.__dict__.update({"weight_quant": "w", "input_quant": "a", "moe": "cfg"})
    return method


def test_vllms_w8a8_int8_method_gets_the_plugins_forward_and_keeps_its_state() -> None:
    from vllm.model_executor.layers.quantization.compressed_tensors import (
        compressed_tensors_moe as ct,
    )

    vllms = _int8_method(ct.CompressedTensorsW8A8Int8MoEMethod)
    layer = _served_layer(quant_method=vllms)
    fused_moe_method.serve(layer)
    ours = layer.quant_method
    assert type(ours) is fused_moe_method.KunlunW8A8Int8MoEMethod
    assert isinstance(ours, ct.CompressedTensorsW8A8Int8MoEMethod)
    assert ours.__dict__ == vllms.__dict__ and ours.is_monolithic
    assert ours.maybe_make_prepare_finalize() is None


def test_other_quantized_moe_methods_are_refused_at_construction() -> None:
    from vllm.model_executor.layers.quantization.compressed_tensors import (
        compressed_tensors_moe as ct,
    )

    class Derived(ct.CompressedTensorsW8A8Int8MoEMethod):  # may mean other weights
        pass

    for method in (
        _int8_method(Derived),
        object.__new__(ct.CompressedTensorsW8A8Fp8MoEMethod),
    ):
        layer = _served_layer(quant_method=method, quant_config=SimpleNamespace())
        with pytest.raises(ValueError, match=type(method).__name__):
            fused_moe_method.serve(layer)


def test_int8_experts_forward_matches_dequantized_weights_on_quantized_inputs() -> None:
    """The W8A8 method's forward: per-token int8 activations x int8 weights x scales,
    against a float64 loop on the dequantized weights with the activations rounded
    the same way (absmax / 127 per token)."""
    torch.manual_seed(5)
    experts, hidden, inter, tokens, top_k = 8, 32, 16, 6, 2
    w13 = torch.randn(experts, 2 * inter, hidden)
    w2 = torch.randn(experts, hidden, inter)

    def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale = w.abs().amax(dim=-1, keepdim=True) / 127
        return torch.round(w / scale).clamp(-128, 127).to(torch.int8), scale

    q13, s13 = quantize(w13)
    q2, s2 = quantize(w2)
    layer = _layer(top_k=top_k, w13_weight=q13, w2_weight=q2)
    layer.w13_weight_scale, layer.w2_weight_scale = s13, s2  # [E, N, 1]
    method = object.__new__(fused_moe_method.KunlunW8A8Int8MoEMethod)
    x, logits = torch.randn(tokens, hidden), _logits(experts, tokens, 4)
    got = method.apply_monolithic(layer, x, logits)

    def per_token(a: torch.Tensor) -> torch.Tensor:
        scale = a.abs().amax(dim=-1, keepdim=True) / 127
        return torch.round(a / scale).clamp(-128, 127) * scale

    weights, ids = routing.select_experts(x, logits, routing.Routing(top_k=top_k))
    d13, d2 = (q13.double() * s13.double()), (q2.double() * s2.double())
    want = torch.zeros(tokens, hidden, dtype=torch.float64)
    for t in range(tokens):
        for s in range(top_k):
            e = int(ids[t, s])
            gate, up = (d13[e] @ per_token(x[t : t + 1].double())[0]).chunk(2)
            h = per_token((F.silu(gate) * up).unsqueeze(0))[0]
            want[t] += float(weights[t, s]) * (d2[e] @ h)
    torch.testing.assert_close(got.double(), want, atol=2e-3, rtol=2e-3)
