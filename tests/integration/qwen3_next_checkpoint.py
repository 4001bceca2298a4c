"""A tiny Qwen3-Next checkpoint written by transformers 5.2.0's own classes.

``Qwen3NextForCausalLM(Qwen3NextConfig(...))`` with a seeded init, saved by
``save_pretrained`` (the experts as transformers saves them), plus the offline tokenizer
every tiny checkpoint shares (``vllm_kunlun.demo.tiny_model``). Two layouts:
- ``moe``: the released layout in miniature: a sparse block (routed experts, top-k, a
  gated shared expert) in every layer, three Gated DeltaNet layers then one gated
  full-attention layer (``full_attention_interval`` 4, as released);
- ``dense``: the same with ``mlp_only_layers`` listing every layer (a dense MLP in
  each), which transformers and vLLM both honour.
Other layouts by ``mlp_only_layers`` (e.g. ``[1]``: one dense layer among sparse ones).
A few initial values are widened from transformers' defaults so that greedy decoding
has clear margins and the GDN states carry information across tokens and chunks: the
embedding and lm_head scale, and slow decays (``A_log``).

``mtp=True`` adds a multi-token-prediction head (``mtp.*``: ``fc``, the two pre-fc
norms, one full-attention decoder layer with the model's MLP kind, the final norm), as
released Qwen3-Next checkpoints carry it and vLLM's ``Qwen3NextMTP`` loads it;
transformers does not model it, so it is drawn here (seeded, untrained: its drafts are
mostly rejected) and appended to transformers' safetensors file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_kunlun.demo.tiny_model import vocabulary, write_tokenizer_files

SEED = 20261207
NUM_LAYERS = 4

SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": NUM_LAYERS,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "partial_rotary_factor": 0.25,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48,
    "decoder_sparse_step": 1,
    "norm_topk_prob": True,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "initializer_range": 0.08,
    "full_attention_interval": 4,
}


def write_qwen3_next(
    directory: Path, layout: str = "moe", mtp: bool = False, **overrides: Any
) -> Path:
    """Write the checkpoint and tokenizer into ``directory``; returns it."""
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    if layout not in ("moe", "dense"):
        raise ValueError(f"layout {layout!r} is not 'moe' or 'dense'")
    vocab = vocabulary()
    fields = {**SHAPE, **overrides}
    if layout == "dense":
        fields["mlp_only_layers"] = list(range(fields["num_hidden_layers"]))
    config = Qwen3NextConfig(vocab_size=len(vocab), **fields)
    config.architectures = ["Qwen3NextForCausalLM"]
    torch.manual_seed(SEED)
    model = Qwen3NextForCausalLM(config).to(torch.float32)
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 1.0, generator=gen)
        model.lm_head.weight.normal_(0.0, 0.5, generator=gen)
        for layer in model.model.layers:
            gdn = getattr(layer, "linear_attn", None)
            if gdn is not None:  # decay rates A in [0.05, 0.5]
                a = torch.empty(gdn.A_log.shape).uniform_(0.05, 0.5, generator=gen)
                gdn.A_log.copy_(a.log())
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    write_tokenizer_files(directory, vocab)
    if mtp:
        _append_mtp_head(directory, model, gen)
    return directory


def _append_mtp_head(directory: Path, model: Any, gen: Any) -> None:
    """``mtp.*`` next to transformers' weights: a full-attention layer's tensors
    (the last layer's names and shapes, redrawn) as ``mtp.layers.0``."""
    import torch
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    weights = load_file(str(path))
    h = model.config.hidden_size
    full = model.config.layer_types.index("full_attention")
    prefix = f"model.layers.{full}."
    head = {
        "mtp.fc.weight": torch.randn(h, 2 * h, generator=gen) / (2 * h) ** 0.5,
        "mtp.pre_fc_norm_hidden.weight": torch.zeros(h),
        "mtp.pre_fc_norm_embedding.weight": torch.zeros(h),
        "mtp.norm.weight": torch.zeros(h),
    }
    for name, tensor in weights.items():
        if name.startswith(prefix):
            redrawn = torch.randn(tensor.shape, generator=gen) * tensor.float().std()
            head["mtp.layers.0." + name[len(prefix) :]] = redrawn.to(tensor.dtype)
    save_file({**weights, **head}, str(path), metadata={"format": "pt"})
