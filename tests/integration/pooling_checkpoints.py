"""Tiny embedding checkpoints written by transformers 5.2.0's own classes.

- ``decoder``: a Qwen3-Embedding in miniature: ``Qwen3Model`` saved by ``save_pretrained``
  (unprefixed weights) with ``architectures: ["Qwen3ForCausalLM"]``, as Qwen3-Embedding
  ships, and the sentence-transformers files that give its pooling (last token,
  normalized);
- ``encoder``: a BGE-M3 in miniature: ``XLMRobertaModel`` (absolute positions after the
  padding index, post-norm layers, a pooler vLLM does not use) with CLS pooling,
  normalized.
Both carry the offline tokenizer every tiny checkpoint shares
(``vllm_kunlun.demo.tiny_model``: ``<pad>`` is id 2, which the encoder takes as its padding
index). Layer matrices are drawn at unit fan-in scale (transformers' 0.02 leaves every
layer's contribution near zero beside the embeddings) so that attention decides the
embedding.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_kunlun.demo.tiny_model import vocabulary, write_tokenizer_files

SEED = 20261209
KINDS = ("decoder", "encoder")
PAD_ID = 2  # "<pad>" in the tiny vocabulary

SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}
POOLING = {"decoder": "pooling_mode_lasttoken", "encoder": "pooling_mode_cls_token"}


def _sentence_transformers_files(directory: Path, kind: str) -> None:
    modules = [
        {
            "idx": 0,
            "name": "0",
            "path": "",
            "type": "sentence_transformers.models.Transformer",
        },
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
        {
            "idx": 2,
            "name": "2",
            "path": "2_Normalize",
            "type": "sentence_transformers.models.Normalize",
        },
    ]
    (directory / "modules.json").write_text(json.dumps(modules, indent=2))
    pooling = {
        "word_embedding_dimension": SHAPE["hidden_size"],
        **{mode: mode == POOLING[kind] for mode in sorted(set(POOLING.values()))},
        "pooling_mode_mean_tokens": False,
    }
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    (directory / "2_Normalize").mkdir(exist_ok=True)


def write_embedding_model(directory: Path, kind: str) -> Path:
    """Write the checkpoint, tokenizer and sentence-transformers files; returns it."""
    import torch
    import transformers

    vocab = vocabulary()
    if kind == "decoder":
        config: Any = transformers.Qwen3Config(
            vocab_size=len(vocab),
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=2048,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            **SHAPE,
        )
        config.architectures = ["Qwen3ForCausalLM"]
        cls: Any = transformers.Qwen3Model
    elif kind == "encoder":
        config = transformers.XLMRobertaConfig(
            vocab_size=len(vocab),
            max_position_embeddings=514,
            type_vocab_size=1,
            pad_token_id=PAD_ID,
            bos_token_id=0,
            eos_token_id=0,
            **SHAPE,
        )
        config.architectures = ["XLMRobertaModel"]
        cls = transformers.XLMRobertaModel
    else:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    torch.manual_seed(SEED)
    model = cls(config).to(torch.float32)
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() < 2:
                continue
            if "embeddings" in name or "embed_tokens" in name:
                param.normal_(0.0, 1.0, generator=gen)
            else:
                param.normal_(0.0, param[0].numel() ** -0.5, generator=gen)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    write_tokenizer_files(directory, vocab)
    _sentence_transformers_files(directory, kind)
    return directory
