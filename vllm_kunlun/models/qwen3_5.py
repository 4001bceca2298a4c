"""Qwen3.5 dense hybrid (Gated DeltaNet + gated full attention), text path, for vLLM 0.15.1.

Why: vLLM 0.15.1 has no Qwen3.5 model; its nearest relative, ``Qwen3NextForCausalLM``,
requires MoE and Qwen3-Next's grouped projection layout. The deployment this plugin
serves runs a Qwen3.5-family checkpoint (the vision-language composite), so the plugin
brings the model.

How: vLLM's Qwen3-Next blocks are reused where Qwen3.5 is the same:
- ``Qwen3NextAttention`` (gated attention: q_proj holds each head's query and gate; q/k
  Gemma-style RMSNorm; partial rotary, here M-RoPE with ``mrope_section``);
- ``Qwen3NextGatedDeltaNet``'s core: the ``vllm::gdn_attention_core`` op and its
  ``_forward_core`` (conv, gating, chunked prefill, recurrent decode, state I/O on
  vLLM's ``kv_cache`` views), whose kernels go through ``vllm_kunlun/ops/gdn/seam.py``
  (runtime patch in ``vllm_kunlun/ops/gdn/patches.py``);
- the state shape/dtype/copy calculators and the GDN attention backend.
What differs and lives here: separate ``in_proj_qkv`` / ``in_proj_z`` / ``in_proj_b`` /
``in_proj_a`` projections (Qwen3-Next groups them per key head), a dense MLP in every
layer, M-RoPE positions (text only: the three rows are the token positions), and the
composite checkpoint layout (``model.language_model.*``, nested ``text_config``).

The MoE members reuse all of this with a sparse block in place of the MLP
(``models/qwen3_5_moe.py``); the vision-language composite adds the vision tower
(``models/qwen3_5_vl.py``). The ``mtp.*`` head is skipped here: the MTP draft model
(``models/qwen3_5_mtp.py``) loads it for speculative decoding.
Correctness reference: transformers 5.2.0 ``models/qwen3_5/modeling_qwen3_5.py``.

Removal: when the validated vLLM ships a Qwen3.5 implementation that runs here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import islice
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers.activations import ACT2FN
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.distributed import (
    divide,
    get_pp_group,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from vllm.model_executor.layers.layernorm import GemmaRMSNorm, RMSNormGated
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.mamba.mamba_mixer2 import mamba_v2_sharded_weight_loader
from vllm.model_executor.layers.mamba.mamba_utils import (
    MambaStateCopyFunc,
    MambaStateCopyFuncCalculator,
    MambaStateShapeCalculator,
)
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.model_loader.weight_utils import (
    default_weight_loader,
    sharded_weight_loader,
)
from vllm.model_executor.models.interfaces import (
    HasInnerState,
    IsHybrid,
    SupportsLoRA,
    SupportsMRoPE,
    SupportsPP,
)
from vllm.model_executor.models.qwen2_moe import Qwen2MoeMLP
from vllm.model_executor.models.qwen3_next import (
    Qwen3NextAttention,
    Qwen3NextGatedDeltaNet,
)
from vllm.model_executor.models.utils import (
    PPMissingLayer,
    extract_layer_index,
    is_pp_missing_parameter,
    make_empty_intermediate_tensors_factory,
    make_layers,
    maybe_prefix,
)
from vllm.model_executor.utils import set_weight_attrs
from vllm.sequence import IntermediateTensors
from vllm.v1.kv_cache_interface import KVCacheSpec, MambaSpec

from vllm_kunlun.logger import init_logger
from vllm_kunlun.models.qwen3_5_config import num_spec, text_config
from vllm_kunlun.ops.gdn.state_dtype import gdn_state_dtypes_for

if TYPE_CHECKING:
    from vllm.multimodal.inputs import MultiModalFeatureSpec

logger = init_logger(__name__)

# Checkpoint prefixes that carry no text weights: the vision tower and the MTP head.
_SKIPPED_PREFIXES = {
    "model.visual.": "the vision tower (a text-only checkpoint class)",
    "visual.": "the vision tower (a text-only checkpoint class)",
    "mtp.": "the multi-token-prediction head (the MTP draft model loads it)",
}
# (param in this model, name in the checkpoint, shard id)
_STACKED = (
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
    ("in_proj_ba", "in_proj_b", 0),
    ("in_proj_ba", "in_proj_a", 1),
)


class Qwen3_5GatedDeltaNet(Qwen3NextGatedDeltaNet):
    """Qwen3-Next's GDN layer with Qwen3.5's four separate input projections.

    ``Qwen3NextGatedDeltaNet.__init__`` is not called: it builds Qwen3-Next's fused
    ``in_proj_qkvz`` / ``in_proj_ba`` (grouped per key head), which Qwen3.5 does not
    have. This constructor sets every attribute the inherited methods read
    (``_forward_core``, ``rearrange_mixed_qkv``, state shape and dtype).
    """

    def __init__(self, config: Any, vllm_config: VllmConfig, prefix: str = "") -> None:
        nn.Module.__init__(self)
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.hidden_size = config.hidden_size
        self.num_v_heads = config.linear_num_value_heads
        self.num_k_heads = config.linear_num_key_heads
        self.head_k_dim = config.linear_key_head_dim
        self.head_v_dim = config.linear_value_head_dim
        self.key_dim = self.head_k_dim * self.num_k_heads
        self.value_dim = self.head_v_dim * self.num_v_heads
        self.conv_kernel_size = config.linear_conv_kernel_dim
        self.layer_idx = extract_layer_index(prefix)
        self.activation = config.hidden_act
        self.act = ACT2FN[config.hidden_act]
        self.layer_norm_epsilon = config.rms_norm_eps
        self.prefix = prefix
        self.config = config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.quant_config = quant_config = vllm_config.quant_config
        self.speculative_config = vllm_config.speculative_config
        self.num_spec = num_spec(vllm_config)

        # q | k | v, each split over TP ranks on its own (in_proj_qkv is fused on disk).
        self.in_proj_qkv = MergedColumnParallelLinear(
            self.hidden_size,
            [self.key_dim, self.key_dim, self.value_dim],
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.in_proj_qkv",
        )
        self.in_proj_z = ColumnParallelLinear(
            self.hidden_size,
            self.value_dim,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.in_proj_z",
        )
        # b | a, one value per value head each (in_proj_b and in_proj_a on disk).
        self.in_proj_ba = MergedColumnParallelLinear(
            self.hidden_size,
            [self.num_v_heads, self.num_v_heads],
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.in_proj_ba",
        )

        # The depthwise conv as Qwen3-Next stores it: [conv_dim, 1, K], q/k/v sharded.
        self.conv_dim = self.key_dim * 2 + self.value_dim
        self.conv1d = ColumnParallelLinear(
            input_size=self.conv_kernel_size,
            output_size=self.conv_dim,
            bias=False,
            prefix=f"{prefix}.conv1d",
        )
        self.conv1d.weight.data = self.conv1d.weight.data.unsqueeze(1)
        delattr(self.conv1d.weight, "weight_loader")
        qk, v = (self.key_dim, 0, False), (self.value_dim, 0, False)
        set_weight_attrs(
            self.conv1d.weight,
            {
                "weight_loader": mamba_v2_sharded_weight_loader(
                    [qk, qk, v], self.tp_size, self.tp_rank
                )
            },
        )

        heads_per_rank = divide(self.num_v_heads, self.tp_size)
        self.dt_bias = nn.Parameter(torch.ones(heads_per_rank))
        self.A_log = nn.Parameter(torch.empty(heads_per_rank))
        # checkpoint_shape: the whole on-disk tensor, for the checkpoint guard
        # (vllm_kunlun/guards/checkpoint.py), which cannot see through these loaders.
        for param in (self.A_log, self.dt_bias):
            set_weight_attrs(
                param,
                {
                    "weight_loader": sharded_weight_loader(0),
                    "checkpoint_shape": (self.num_v_heads,),
                },
            )

        # Norm before gate, plain weight: out = rmsnorm(x) * w * silu(z).
        self.norm = RMSNormGated(
            self.head_v_dim,
            eps=self.layer_norm_epsilon,
            group_size=None,
            norm_before_gate=True,
            dtype=vllm_config.model_config.dtype,
        )
        self.out_proj = RowParallelLinear(
            self.value_dim,
            self.hidden_size,
            bias=False,
            input_is_parallel=True,
            quant_config=quant_config,
            prefix=f"{prefix}.out_proj",
        )

        context = get_current_vllm_config().compilation_config.static_forward_context
        if prefix in context:
            raise ValueError(f"Duplicate layer name: {prefix}")
        context[prefix] = self

    def get_state_dtype(self) -> tuple[torch.dtype, torch.dtype]:
        """(conv, recurrent) by the plugin's rule, not vLLM's single mamba dtype."""
        return state_torch_dtypes(self.model_config, self.cache_config)

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec | None:
        """vLLM's ``MambaBase.get_kv_cache_spec`` without its model-type gate: it
        refuses speculative decoding for every hybrid but ``qwen3_next``, whose GDN
        layer (and state layout: ``num_spec`` extra conv columns, one state block per
        speculative token) this layer shares."""
        cache = vllm_config.cache_config
        return MambaSpec(
            shapes=self.get_state_shape(),
            dtypes=self.get_state_dtype(),
            block_size=cache.mamba_block_size,
            page_size_padded=cache.mamba_page_size_padded,
            mamba_type=self.mamba_type,
            mamba_cache_mode=cache.mamba_cache_mode,
            num_speculative_blocks=num_spec(vllm_config),
        )

    def forward(self, hidden_states: torch.Tensor, output: torch.Tensor) -> None:
        num_tokens = hidden_states.size(0)
        mixed_qkv, _ = self.in_proj_qkv(hidden_states)
        z, _ = self.in_proj_z(hidden_states)
        ba, _ = self.in_proj_ba(hidden_states)
        b, a = ba.chunk(2, dim=-1)
        core_attn_out = torch.zeros(
            (num_tokens, self.num_v_heads // self.tp_size, self.head_v_dim),
            dtype=hidden_states.dtype,
            device=hidden_states.device,
        )
        torch.ops.vllm.gdn_attention_core(
            mixed_qkv, b.contiguous(), a.contiguous(), core_attn_out, self.prefix
        )
        z = z.reshape(-1, self.head_v_dim)
        gated = self.norm(core_attn_out.reshape(-1, self.head_v_dim), z)
        output[:num_tokens], _ = self.out_proj(gated.reshape(num_tokens, -1))


# Builds a layer's MLP from (vllm_config, prefix=...): the MoE models' sparse block.
SparseBlock = Callable[..., nn.Module]


def state_torch_dtypes(model: Any, cache: Any) -> tuple[torch.dtype, torch.dtype]:
    """The GDN states' dtypes by the plugin's rule (``ops/gdn/state_dtype.py``): the
    recurrent state follows ``--mamba-ssm-cache-dtype``, else the checkpoint's
    ``mamba_ssm_dtype``, where vLLM would keep it in the model dtype."""
    conv, ssm = gdn_state_dtypes_for(model, cache)
    return getattr(torch, conv), getattr(torch, ssm)


class Qwen3_5DecoderLayer(nn.Module):
    """One decoder layer: GDN or full attention, then the dense MLP, or the
    ``sparse_block`` its caller passes when the config has experts (the MoE models of
    ``qwen3_5_moe.py``; this module does not import them)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        layer_type: str,
        prefix: str,
        sparse_block: SparseBlock | None = None,
    ) -> None:
        super().__init__()
        config = text_config(vllm_config)
        self.layer_type = layer_type
        if layer_type == "linear_attention":
            self.linear_attn = Qwen3_5GatedDeltaNet(
                config, vllm_config, prefix=f"{prefix}.linear_attn"
            )
        elif layer_type == "full_attention":
            self.self_attn = Qwen3NextAttention(
                config,
                model_config=vllm_config.model_config,
                cache_config=vllm_config.cache_config,
                quant_config=vllm_config.quant_config,
                prefix=f"{prefix}.self_attn",
            )
        else:
            raise ValueError(
                f"layer type {layer_type!r} in layer_types is not a Qwen3.5 layer "
                "(linear_attention or full_attention)"
            )
        self.mlp: nn.Module
        if getattr(config, "num_experts", 0):
            if sparse_block is None:
                raise ValueError(
                    "a Qwen3.5 config with num_experts needs the MoE model classes "
                    "(models/qwen3_5_moe.py), which pass their sparse block here"
                )
            self.mlp = sparse_block(vllm_config, prefix=f"{prefix}.mlp")
        else:
            self.mlp = Qwen2MoeMLP(
                hidden_size=config.hidden_size,
                intermediate_size=config.intermediate_size,
                hidden_act=config.hidden_act,
                quant_config=vllm_config.quant_config,
                prefix=f"{prefix}.mlp",
            )
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(
            config.hidden_size, eps=config.rms_norm_eps
        )

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        residual: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        mixed = torch.empty_like(hidden_states)
        if self.layer_type == "linear_attention":
            self.linear_attn(hidden_states=hidden_states, output=mixed)
        else:
            self.self_attn(
                positions=positions, output=mixed, hidden_states=hidden_states
            )
        hidden_states, residual = self.post_attention_layernorm(mixed, residual)
        return self.mlp(hidden_states), residual


@support_torch_compile(
    dynamic_arg_dims={
        "input_ids": 0,
        # M-RoPE positions are [3, tokens]: the token dimension is the last one.
        "positions": -1,
        "intermediate_tensors": 0,
        "inputs_embeds": 0,
    }
)
class Qwen3_5Model(nn.Module):
    """The text model. Under pipeline parallelism each stage builds only its own
    layers (``make_layers``: the others are ``PPMissingLayer``, holding no weights and
    no KV or GDN state), the embedding on the first stage (and on the last where the
    checkpoint ties it to ``lm_head``), the final norm on the last; the stages pass
    ``hidden_states`` and ``residual`` on."""

    def __init__(
        self,
        *,
        vllm_config: VllmConfig,
        prefix: str = "",
        sparse_block: SparseBlock | None = None,
    ) -> None:
        super().__init__()
        config = text_config(vllm_config)
        self.config = config
        pp = get_pp_group()
        tied = bool(getattr(config, "tie_word_embeddings", False))
        self.embed_tokens: nn.Module
        if pp.is_first_rank or (tied and pp.is_last_rank):
            self.embed_tokens = VocabParallelEmbedding(
                config.vocab_size, config.hidden_size
            )
        else:
            self.embed_tokens = PPMissingLayer()

        def layer(prefix: str) -> nn.Module:
            layer_type = config.layer_types[extract_layer_index(prefix)]
            return Qwen3_5DecoderLayer(
                vllm_config, layer_type, prefix=prefix, sparse_block=sparse_block
            )

        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers, layer, prefix=f"{prefix}.layers"
        )
        self.norm: nn.Module
        if pp.is_last_rank:
            self.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        else:
            self.norm = PPMissingLayer()
        self.make_empty_intermediate_tensors = make_empty_intermediate_tensors_factory(
            ["hidden_states", "residual"], config.hidden_size
        )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        pp = get_pp_group()
        residual: torch.Tensor | None
        if pp.is_first_rank:
            hidden_states = (
                inputs_embeds
                if inputs_embeds is not None
                else self.embed_tokens(input_ids)
            )
            residual = None
        else:
            assert intermediate_tensors is not None
            hidden_states = intermediate_tensors["hidden_states"]
            residual = intermediate_tensors["residual"]
        for layer in islice(self.layers, self.start_layer, self.end_layer):
            hidden_states, residual = layer(positions, hidden_states, residual)
        if not pp.is_last_rank:
            return IntermediateTensors(
                {"hidden_states": hidden_states, "residual": residual}
            )
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


def _refuse_int8_into_float(
    disk_name: str, name: str, param: torch.Tensor, tensor: torch.Tensor
) -> None:
    """An int8 checkpoint tensor must go into an int8 parameter: copied into a float
    one it serves garbage (NaN and "!!!!" output, as reported for W8A8 MTP heads)."""
    if tensor.dtype == torch.int8 and param.dtype.is_floating_point:
        raise ValueError(
            f"checkpoint tensor {disk_name!r} is int8, but {name!r} is a "
            f"{param.dtype} parameter: the quantization config leaves this layer float "
            "(its quantization_config ignore list names it?). List only the layers "
            "that are float on disk in ignore, or re-export the checkpoint."
        )


class TextWeightLoading:
    """The checkpoint loader of the Qwen3.5 text model, shared with the MTP draft
    (``models/qwen3_5_mtp.py``): ``_checkpoint_name`` maps a checkpoint tensor to this
    module's parameter (or None to skip it, counted), q/k/v, gate/up and b/a are
    loaded into their merged parameters."""

    _text_prefix = "model."
    _skipped: dict[str, int]

    if TYPE_CHECKING:

        def named_parameters(self) -> Iterable[tuple[str, nn.Parameter]]: ...

    def _skip(self, what: str) -> None:
        self._skipped[what] = self._skipped.get(what, 0) + 1

    def _checkpoint_name(self, name: str) -> str | None:
        """This module's parameter name for a checkpoint tensor, or None to skip it."""
        for skipped, what in _SKIPPED_PREFIXES.items():
            if name.startswith(skipped):
                self._skip(what)
                return None
        if name.startswith(self._text_prefix):
            return "model." + name[len(self._text_prefix) :]
        return name

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        self._skipped: dict[str, int] = {}
        for disk_name, tensor in weights:
            name = self._checkpoint_name(disk_name)
            if name is None or "rotary_emb.inv_freq" in name:
                continue
            if is_pp_missing_parameter(name, self):  # type: ignore[arg-type]
                self._skip("other pipeline stages")
                continue
            for param_name, shard_name, shard_id in _STACKED:
                if shard_name not in name:
                    continue
                name = name.replace(shard_name, param_name)
                param = params[name]
                _refuse_int8_into_float(disk_name, name, param, tensor)
                param.weight_loader(param, tensor, shard_id)
                break
            else:
                if name not in params:
                    raise ValueError(
                        f"checkpoint tensor {disk_name!r} has no place in "
                        f"{type(self).__name__} (looked for {name!r}); is this a "
                        "Qwen3.5 checkpoint of the layout its config.json names?"
                    )
                param = params[name]
                _refuse_int8_into_float(disk_name, name, param, tensor)
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        if self._skipped:
            logger.info(
                "vllm-kunlun: Qwen3.5 text path: skipped %s",
                "; ".join(
                    f"{n} weights of {what}" for what, n in self._skipped.items()
                ),
            )
        return loaded


class Qwen3_5ForCausalLM(
    TextWeightLoading,
    nn.Module,
    HasInnerState,
    IsHybrid,
    SupportsLoRA,
    SupportsMRoPE,
    SupportsPP,
):
    """``Qwen3_5ForCausalLM`` checkpoints: weights ``model.*`` and ``lm_head.*``.

    LoRA (vLLM's layers, the plugin's punica wrapper): attention ``q/k/v/o_proj``, MLP
    ``gate/up/down_proj``, GDN ``in_proj_qkv`` (one fused tensor in peft's files, split
    into q | k | v by vLLM's variable-slice layer), ``in_proj_z``, ``in_proj_b`` /
    ``in_proj_a`` (packed as ``in_proj_ba``) and ``out_proj``. ``conv1d`` is a linear
    layer only as a weight holder (the conv kernels read its weight): vLLM would accept
    an adapter for it and never apply it, so ``LORA_REFUSED_MODULES`` names it and the
    adapter check (``ops/lora/adapter_check.py``) refuses it at load. Only this class
    (the causal checkpoint) is served with LoRA: ``platforms/lora.py`` refuses the
    composite and MoE members at start.
    """

    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
        "in_proj_ba": ["in_proj_b", "in_proj_a"],
    }
    # Linear layers vLLM wraps for LoRA whose forward never runs: module -> why.
    LORA_REFUSED_MODULES = {
        "conv1d": "the GDN depthwise convolution's weight, read by the conv kernels; "
        "its forward never runs, so an adapter on it would be silently ignored",
    }
    # Checkpoint prefix of the text model -> this module's.
    _text_prefix = "model."
    # Whether this class serves the MoE members, and their sparse block (both set by
    # qwen3_5_moe.py).
    moe = False
    sparse_block: SparseBlock | None = None

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        # The deployments this class does not serve were refused at engine start
        # (guards/qwen3_5_deployment.py).
        from vllm_kunlun.patching.phases import Phase, apply_phase

        # The GDN kernels and the hybrid-state fixes must be in place in the process
        # that runs this model (engine core or worker), whatever VLLM_PLUGINS says.
        apply_phase(Phase.HYBRID_MODEL)
        config = text_config(vllm_config)
        self.config = config
        self.vllm_config = vllm_config
        self.model = Qwen3_5Model(
            vllm_config=vllm_config,
            prefix=maybe_prefix(prefix, "model"),
            sparse_block=self.sparse_block,
        )
        self.lm_head: nn.Module
        if get_pp_group().is_last_rank:
            self.lm_head = ParallelLMHead(
                config.vocab_size,
                config.hidden_size,
                prefix=maybe_prefix(prefix, "lm_head"),
            )
            if getattr(config, "tie_word_embeddings", False):
                self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        else:
            self.lm_head = PPMissingLayer()
        self.logits_processor = LogitsProcessor(config.vocab_size)
        self.make_empty_intermediate_tensors = (
            self.model.make_empty_intermediate_tensors
        )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor | IntermediateTensors:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)  # type: ignore[arg-type]

    # ---- M-RoPE: text-only positions --------------------------------------------------
    def get_mrope_input_positions(
        self,
        input_tokens: list[int],
        mm_features: list[MultiModalFeatureSpec],
    ) -> tuple[torch.Tensor, int]:
        """Text only: temporal, height and width positions are all the token index,
        which makes interleaved M-RoPE exactly the plain rotary embedding."""
        if mm_features:
            raise ValueError(
                "vllm-kunlun serves the Qwen3.5 text path only: image and video inputs "
                "are not supported yet. Send text-only prompts."
            )
        positions = torch.arange(len(input_tokens), dtype=torch.int64)
        return positions.unsqueeze(0).expand(3, -1).clone(), 0

    # ---- hybrid state (vLLM's GDN calculators, on the text config) ---------------------
    @classmethod
    def get_mamba_state_dtype_from_config(
        cls, vllm_config: VllmConfig
    ) -> tuple[torch.dtype, torch.dtype]:
        return state_torch_dtypes(vllm_config.model_config, vllm_config.cache_config)

    @classmethod
    def get_mamba_state_shape_from_config(
        cls, vllm_config: VllmConfig
    ) -> tuple[tuple[int, int], tuple[int, int, int]]:
        config = text_config(vllm_config)
        shapes: tuple[tuple[int, int], tuple[int, int, int]] = (
            MambaStateShapeCalculator.gated_delta_net_state_shape(
                vllm_config.parallel_config.tensor_parallel_size,
                config.linear_num_key_heads,
                config.linear_num_value_heads,
                config.linear_key_head_dim,
                config.linear_value_head_dim,
                config.linear_conv_kernel_dim,
                num_spec(vllm_config),
            )
        )
        return shapes

    @classmethod
    def get_mamba_state_copy_func(cls) -> tuple[MambaStateCopyFunc, MambaStateCopyFunc]:
        return MambaStateCopyFuncCalculator.gated_delta_net_state_copy_func()


class Qwen3_5TextOnlyForConditionalGeneration(Qwen3_5ForCausalLM):
    """The vision-language composite on its text path only (weights
    ``model.language_model.*`` and ``lm_head.*``; the vision tower's are skipped).

    Registered for ``Qwen3_5ForConditionalGeneration`` where torchvision is missing:
    vLLM 0.15.1's Qwen-VL processors cannot be imported without it
    (``models/__init__.py``). Not a vLLM multimodal model: prompts with image or video
    data are refused by vLLM's input processing before they reach the engine.
    """

    _text_prefix = "model.language_model."
