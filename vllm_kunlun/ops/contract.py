"""The vendor API contract: every vendor function the plugin calls and the keyword
arguments it passes.

One manifest, read by the doctor (which compares it with the installed vendor library's
real signatures: the deployment log's "11 missing ops, 3 keyword mismatches" case,
docs/deployment-log.md D9; the call forms: docs/vendor-calls.md) and
by the tests (which check that the plugin calls nothing that is not declared here).
Keys: vendor module -> function name -> keyword arguments we pass.
"""

from __future__ import annotations

VENDOR_CONTRACT: dict[str, dict[str, tuple[str, ...]]] = {
    "torch_xmlir": {
        # vllm_kunlun/ops/vendor.py: the device count (torch.xpu's is an Intel stub).
        "_XMLIRC._xpu_get_devices_number": (),
    },
    "kunlun_ops": {
        # vllm_kunlun/ops/sampling/seam.py: flashinfer's API; probs is passed positionally.
        "top_k_top_p_sampling_from_probs": ("top_k", "top_p", "deterministic"),
        # vllm_kunlun/ops/attention/paged_vendor.py (the Kunlun attention backend). Keywords as
        # upstream passes them; the KV cache is BHLD: [num_blocks, kv_heads, block, dim].
        "reshape_and_cache_flash": ("BLHD_LAYOUT",),
        "paged_attention": (
            "x",
            "k_cache",
            "v_cache",
            "block_tables",
            "context_lens_cpu",
            "context_lens_xpu",
            "is_context",
            "is_causal",
            "out",
            "vo_head_dim",
        ),
        "prefill_attention": (
            "q",
            "k",
            "v",
            "out",
            "is_causal",
            "is_prefix_cache",
            "block_table",
            "context_qlen_lod_cpu",
            "context_qlen_lod_xpu",
            "context_kvlen_lod_cpu",
            "context_kvlen_lod_xpu",
        ),
        # vllm_kunlun/ops/custom_ops/norms_vendor.py: rmsnorm, gemma_rmsnorm and rms_norm_gated take
        # positional arguments only (upstream never names them).
        "rmsnorm": (),
        "add_rmsnorm": ("residual_output", "weight", "eps", "output"),
        "gemma_rmsnorm": (),
        "gemma_add_rmsnorm": (
            "weight",
            "output",
            "eps",
            "residual_output",
            "store_output_before_norm",
        ),
        "rms_norm_gated": (),
        # vllm_kunlun/ops/custom_ops/rotary_vendor.py
        "rotary_embedding": (
            "positions",
            "query",
            "key",
            "head_size",
            "cos_sin_cache",
            "is_neox",
        ),
        "mrotary_embedding_neox": (),
        # vllm_kunlun/ops/custom_ops/activation_vendor.py
        "silu_and_mul": ("axis", "turn", "out"),
        # vllm_kunlun/ops/int8/seam.py: W8A8 int8 linear (symmetric activations).
        "quant2d": ("x", "y", "max", "force_sdnn"),
        "matmul": (
            "x",
            "w",
            "out",
            "x_trans",
            "w_trans",
            "alpha",
            "beta",
            "bias",
            "x_max",
            "w_max",
            "x_pc_max",
            "w_pc_max",
        ),
        # vllm_kunlun/ops/gdn/seam.py: the GDN decode recurrence; q, k, v, g, beta, scale
        # and the state pool are passed positionally.
        "fused_recurrent_gated_delta_rule_fwdv2": (
            "inplace_final_state",
            "cu_seqlens",
            "h0_indices",
            "num_accepted_tokens",
            "use_qk_l2norm_in_kernel",
            "is_h0_transposed",
        ),
        # vllm_kunlun/ops/mla/seam.py: the latent cache write (positional, as upstream
        # passes it) and the absorbed MLA decode over slot indices, by keyword.
        "concat_and_cache_mla": (),
        "fwd_kvcache_mla": (
            "q_c",
            "kv_cache",
            "indices",
            "kv_lod_cpu",
            "out",
            "max_logits",
            "p_sums",
            "softmax_scale",
            "max_seq_kv",
            "kv_lod_xpu",
        ),
        # vllm_kunlun/ops/moe/seam.py: the whole routed MoE block (softmax top-k routing
        # and the expert MLPs), every argument by keyword as upstream passes it.
        "moe_ffn_block": (
            "x",
            "gate_w",
            "inter_w",
            "output_w",
            "expert_num",
            "moe_top_k",
            "topk_group",
            "renormalize",
            "use_grouped_topk",
            "expert_group_num",
            "out",
        ),
        # vllm_kunlun/ops/moe/routing_vendor.py: vLLM FusedMoE routing, by keyword as
        # upstream passes it (outputs preallocated, block statistics None).
        "moe_softmax_topk_norm": (
            "x",
            "normed_score",
            "topk_index",
            "block_statistic",
            "stable",
        ),
        "moe_sigmoid_group_topk_norm": (
            "x",
            "norm_score",
            "topk_index",
            "block_static",
            "bias",
            "scale",
            "n_group",
            "topk_group",
        ),
    },
    # torch custom ops (torch.ops.xspeedgate_ops.*, registered on import), called
    # positionally with vLLM's _C signatures: only their presence is checked.
    "xspeedgate_ops": {
        # vllm_kunlun/ops/int8/seam.py: static quantization, asymmetric activations.
        "dynamic_scaled_int8_quant": (),
        "static_scaled_int8_quant": (),
        "cutlass_scaled_mm_azp": (),
        # vllm_kunlun/ops/lora/seam.py: gathered LoRA matmuls (punica bgmv).
        "bgmv_shrink_cluster": (),
        "bgmv_expand_cluster": (),
        # vllm_kunlun/ops/int4/seam.py: weight-only int4 / int8 GEMM (GPTQ layouts).
        "gptq_gemm": (),
    },
}
