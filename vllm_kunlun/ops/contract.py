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
        # vllm_kunlun/ops/int8_mm.py: W8A8 int8 linear (symmetric activations).
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
    },
    # torch custom ops (torch.ops.xspeedgate_ops.*, registered on import), called
    # positionally with vLLM's _C signatures: only their presence is checked.
    "xspeedgate_ops": {
        # vllm_kunlun/ops/int8_mm.py: static quantization, asymmetric activations.
        "dynamic_scaled_int8_quant": (),
        "static_scaled_int8_quant": (),
        "cutlass_scaled_mm_azp": (),
    },
}
