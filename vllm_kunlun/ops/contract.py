"""The vendor API contract: every vendor function the plugin calls and the keyword
arguments it passes.

One manifest, read by the doctor (which compares it with the installed vendor library's
real signatures: the deployment log's "11 missing ops, 3 keyword mismatches" case) and
by the tests (which check that the plugin calls nothing that is not declared here).
Keys: vendor module -> function name -> keyword arguments we pass.
"""

from __future__ import annotations

VENDOR_CONTRACT: dict[str, dict[str, tuple[str, ...]]] = {
    "torch_xmlir": {},
    "kunlun_ops": {
        # vllm_kunlun/ops/sampling.py: flashinfer's API; probs is passed positionally.
        "top_k_top_p_sampling_from_probs": ("top_k", "top_p", "deterministic"),
        # vllm_kunlun/ops/gdn.py: the GDN decode recurrence; q, k, v, g, beta, scale
        # and the state pool are passed positionally.
        "fused_recurrent_gated_delta_rule_fwdv2": (
            "inplace_final_state",
            "cu_seqlens",
            "h0_indices",
            "num_accepted_tokens",
            "use_qk_l2norm_in_kernel",
            "is_h0_transposed",
        ),
    },
    "xspeedgate_ops": {},
}
