"""The Qwen3.5 multi-token-prediction (MTP) head as vLLM's speculative draft model.

Why: every Qwen3.5 checkpoint ships an MTP head (``mtp.*``, ``mtp_num_hidden_layers``
layers) that predicts the token after next; vLLM 0.15.1 has the head only for
Qwen3-Next (``Qwen3NextMTP``), so ``--speculative-config '{"method": "mtp"}'`` on a
Qwen3.5 checkpoint fails ("Unsupported speculative method: 'mtp'").

How: the same design as Qwen3-Next's head (transformers 5.2.0 has no module for it; the
weight names are those of released checkpoints): for the token ``x[t+1]`` and the
target model's final hidden state ``h[t]``,
  ``z = fc([pre_fc_norm_embedding(embed(x[t+1])), pre_fc_norm_hidden(h[t])])``,
one Qwen3.5 full-attention decoder layer over ``z`` (its own KV cache), ``norm``, and
the target's ``lm_head`` give the logits of ``x[t+2]``. vLLM's EAGLE proposer runs it
``num_speculative_tokens`` times per step (the same layer each time) and replaces the
head's embedding and ``lm_head`` with the target's (shared, as in the checkpoint).
Weights: ``mtp.fc``, ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``,
``mtp.layers.<i>.*`` (the decoder layer, dense MLP or, in the MoE members, routed
experts), ``mtp.norm``; the embedding and ``lm_head`` from the text model's names
(loaded, then replaced by the target's). W8A8 checkpoints: ``mtp.fc`` and the layer's
linears are int8 with a ``weight_scale`` where the quantization config says so, loaded
through the int8 kernel; an int8 tensor into a float layer is refused by name.

The layer's attention is named ``mtp.layers.<num_hidden_layers + i>``: vLLM binds KV
caches by the layer index in the name, and index ``i`` is one of the target's layers.

The speculative config maps Qwen3.5 model types to these classes
(``models/speculative_config.py``). Removal: when the validated vLLM ships a Qwen3.5
MTP model that runs here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group
from vllm.model_executor.layers.layernorm import GemmaRMSNorm
from vllm.model_executor.layers.linear import ColumnParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.models.utils import maybe_prefix
from vllm.sequence import IntermediateTensors

from vllm_kunlun.models.qwen3_5 import Qwen3_5DecoderLayer, TextWeightLoading
from vllm_kunlun.models.qwen3_5_config import text_config
from vllm_kunlun.models.qwen3_5_moe import MoeWeightLoading, Qwen3_5MoeSparseBlock

_LAYER = re.compile(r"^mtp\.layers\.(?P<index>\d+)\.(?P<rest>.*)$")
# Where the text model's embedding lives in each checkpoint layout.
_EMBEDDINGS = ("model.language_model.embed_tokens.", "model.embed_tokens.")


def num_mtp_layers(config: Any) -> int:
    """The checkpoint's MTP layers (Qwen3.5 configs: ``mtp_num_hidden_layers``)."""
    return int(getattr(config, "mtp_num_hidden_layers", 1) or 1)


class Qwen3_5MultiTokenPredictor(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = text_config(vllm_config)
        if get_pp_group().world_size > 1:
            raise ValueError(
                "Qwen3.5 MTP speculative decoding under pipeline parallelism is not "
                "served by vllm-kunlun; use tensor parallelism or drop "
                "--speculative-config"
            )
        self.config = config
        h, eps = config.hidden_size, config.rms_norm_eps
        self.num_mtp_layers = num_mtp_layers(config)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, h)
        self.fc = ColumnParallelLinear(
            2 * h,
            h,
            gather_output=True,
            bias=False,
            return_bias=False,
            quant_config=vllm_config.quant_config,
            prefix=f"{prefix}.fc",
        )
        first = int(config.num_hidden_layers)
        self.layers = nn.ModuleList(
            Qwen3_5DecoderLayer(
                vllm_config,
                "full_attention",
                prefix=f"{prefix}.layers.{first + i}",
                sparse_block=Qwen3_5MoeSparseBlock,
            )
            for i in range(self.num_mtp_layers)
        )
        self.norm = GemmaRMSNorm(h, eps=eps)
        self.pre_fc_norm_hidden = GemmaRMSNorm(h, eps=eps)
        self.pre_fc_norm_embedding = GemmaRMSNorm(h, eps=eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
        spec_step_idx: int = 0,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            assert input_ids is not None
            inputs_embeds = self.embed_input_ids(input_ids)
        joined = torch.cat(
            [
                self.pre_fc_norm_embedding(inputs_embeds),
                self.pre_fc_norm_hidden(hidden_states),
            ],
            dim=-1,
        )
        x = self.fc(joined)
        layer = self.layers[spec_step_idx % self.num_mtp_layers]
        x, residual = layer(positions, x, None)
        out, _ = self.norm(x, residual)
        return out  # type: ignore[no-any-return]


class Qwen3_5MTP(TextWeightLoading, nn.Module):
    """The draft model vLLM's EAGLE proposer builds for ``method: mtp`` on Qwen3.5."""

    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = text_config(vllm_config)
        self.config = config
        self.vllm_config = vllm_config
        self.model = Qwen3_5MultiTokenPredictor(
            vllm_config=vllm_config, prefix=maybe_prefix(prefix, "mtp")
        )
        self.lm_head = ParallelLMHead(
            config.vocab_size,
            config.hidden_size,
            prefix=maybe_prefix(prefix, "lm_head"),
        )
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        if self.tied:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        spec_step_idx: int = 0,
        **kwargs: object,
    ) -> torch.Tensor:
        return self.model(  # type: ignore[no-any-return]
            input_ids, positions, hidden_states, inputs_embeds, spec_step_idx
        )

    def compute_logits(
        self, hidden_states: torch.Tensor, spec_step_idx: int = 0
    ) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)  # type: ignore[arg-type]

    def _checkpoint_name(self, name: str) -> str | None:
        """``mtp.*`` into the predictor, the shared embedding and ``lm_head`` from the
        text model's names; everything else belongs to the target (skipped)."""
        layer = _LAYER.match(name)
        if layer is not None:
            index = int(layer["index"])
            if index >= self.model.num_mtp_layers:
                raise ValueError(
                    f"checkpoint tensor {name!r} is MTP layer {index}, but the config "
                    f"has mtp_num_hidden_layers={self.model.num_mtp_layers}; the "
                    "checkpoint and config.json disagree"
                )
            return f"model.layers.{index}.{layer['rest']}"
        if name.startswith("mtp."):
            return "model." + name[len("mtp.") :]
        for embedding in _EMBEDDINGS:
            if name.startswith(embedding):
                return "model.embed_tokens." + name[len(embedding) :]
        if name.startswith("lm_head.") and not self.tied:
            return name
        self._skip("the target model (it loads them)")
        return None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded: set[str] = super().load_weights(weights)
        # The routed experts are reported by the MoE loader (which calls this one).
        missing = sorted(
            name
            for name, _ in self.named_parameters()
            if name.startswith(("model.fc.", "model.layers."))
            and name.endswith(".weight")  # not the scales quantization methods add
            and ".mlp.experts." not in name
            and name not in loaded
        )
        if missing:
            raise ValueError(
                "the checkpoint has no complete MTP head (missing "
                f"{', '.join(missing[:5])}): it cannot serve --speculative-config "
                "method mtp; serve it without speculative decoding"
            )
        return loaded


class Qwen3_5MoeMTP(MoeWeightLoading, Qwen3_5MTP):
    """The MoE members' head: its decoder layer has routed experts (the MoE text
    model's loader, then the dense one above)."""
