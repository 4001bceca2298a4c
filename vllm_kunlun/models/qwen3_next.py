"""Qwen3-Next served through vLLM 0.15.1's own ``Qwen3NextForCausalLM``, on the GDN seam.

Why: vLLM's Qwen3-Next Gated DeltaNet layers call five Triton kernels (gating, causal
conv1d prefill/update, chunked and recurrent delta rule). Without a Triton driver the
first prefill fails, and Kunlun's vendor GDN kernels never run. The runtime patches
that route those kernel names through ``vllm_kunlun/ops/gdn`` (and the hybrid-state
fixes) live in ``Phase.HYBRID_MODEL``, which only the plugin's Qwen3.5 model applied.

How: this subclass of vLLM's class applies ``Phase.HYBRID_MODEL`` first thing in its
constructor (the process that runs the model, whatever ``VLLM_PLUGINS`` says), then
builds vLLM's model unchanged: the layers, weight loading, state shapes and the MTP
draft (``Qwen3NextMTP``, which vLLM builds after the target in the same process) are
vLLM's. ``models.register_models`` puts it in place of vLLM's entry for
``Qwen3NextForCausalLM`` (``WRAPPED``). Two more differences:
- a config whose layers are all dense (``mlp_only_layers`` listing every layer, or
  ``num_experts`` 0), which transformers 5.2.0 runs, is served: vLLM's
  ``set_moe_parameters`` raises "No Qwen3Next layer found" for it; here the model then
  reports no MoE layers;
- what the plugin does not serve is refused at start with the reason and the fix
  (speculative methods other than MTP; an MTP layer whose MLP kind the plugin's layer
  naming would change, ``models/qwen3_next_mtp.py``; head counts tensor parallelism
  does not divide).

Correctness reference: transformers 5.2.0 ``models/qwen3_next/modeling_qwen3_next.py``
(tests/integration/test_e2e_qwen3_next.py).
Removal: when vLLM routes GDN kernels through a platform hook (then vLLM's own class
serves as is).
"""

from __future__ import annotations

from typing import Any

from vllm.config import VllmConfig
from vllm.model_executor.models import qwen3_next as upstream

from vllm_kunlun.logger import init_logger

logger = init_logger(__name__)

ARCHITECTURE = "Qwen3NextForCausalLM"


def _refuse_unsupported(vllm_config: VllmConfig) -> None:
    config: Any = vllm_config.model_config.hf_config
    spec = vllm_config.speculative_config
    if spec is not None and spec.method != "mtp":
        raise ValueError(
            f"speculative method {spec.method!r} on Qwen3-Next: vllm-kunlun serves "
            "Qwen3-Next speculative decoding with its multi-token-prediction head "
            'only; use --speculative-config \'{"method": "qwen3_next_mtp", '
            '"num_speculative_tokens": N}\''
        )
    if spec is not None:
        from vllm_kunlun.models.qwen3_next_mtp import mlp_kind_changes

        changed = mlp_kind_changes(config)
        if changed:
            raise ValueError(
                f"Qwen3-Next MTP layers {changed} would get another MLP kind (dense or "
                "sparse) here than in vLLM's own naming (this config's mlp_only_layers "
                "/ decoder_sparse_step pick it by layer index, and vllm-kunlun moves "
                "the MTP layers' index past the target's); serve it without "
                "--speculative-config"
            )
    tp = vllm_config.parallel_config.tensor_parallel_size
    for field in ("num_attention_heads", "linear_num_key_heads"):
        heads = int(getattr(config, field))
        if heads % tp:
            raise ValueError(
                f"this Qwen3-Next has {field}={heads}, which tensor parallel size "
                f"{tp} does not divide (each rank holds an equal share of the heads); "
                "use a --tensor-parallel-size that divides "
                f"{config.num_attention_heads} and {config.linear_num_key_heads}"
            )


class Qwen3NextForCausalLM(upstream.Qwen3NextForCausalLM):
    """vLLM's Qwen3-Next with the plugin's GDN kernels and hybrid-state fixes."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        _refuse_unsupported(vllm_config)
        from vllm_kunlun.patching.phases import Phase, apply_phase

        # The GDN kernels and the hybrid-state fixes must be in place in the process
        # that runs this model (engine core or worker), whatever VLLM_PLUGINS says.
        apply_phase(Phase.HYBRID_MODEL)
        super().__init__(vllm_config=vllm_config, prefix=prefix)

    def set_moe_parameters(self) -> None:
        sparse = any(
            isinstance(getattr(layer, "mlp", None), upstream.Qwen3NextSparseMoeBlock)
            for layer in self.model.layers
        )
        if sparse:
            super().set_moe_parameters()
            return
        # Every layer dense: no experts to balance or report.
        logger.info("vllm-kunlun: Qwen3-Next config without sparse layers (dense MLPs)")
        self.expert_weights: list[Any] = []
        self.moe_layers: list[Any] = []
        self.num_moe_layers = 0
        self.num_expert_groups = 1
        self.num_shared_experts = 0
        self.num_logical_experts = 0
        self.num_physical_experts = 0
        self.num_local_physical_experts = 0
        self.num_routed_experts = 0
        self.num_redundant_experts = 0
