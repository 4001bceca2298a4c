"""A tiny Qwen3.5 composite whose MTP head predicts: model and head trained on the CPU.

Why: speculative decoding is only worth measuring (and its acceptance only worth
asserting) when the draft agrees with the target. A random MTP head is rejected at
almost every step. This checkpoint is the tiny hybrid of ``tiny_qwen3_5`` (composite
layout: ``model.language_model.*``, vision tower, ``mtp.*``) trained for a few seconds
on a synthetic language, with a complete MTP head in Qwen3.5's names
(``mtp.fc``, ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``,
``mtp.layers.0.*``, ``mtp.norm``) trained next to it.

The language (code, no download): every sequence follows one of two fixed permutations
of the content tokens, ``x[t+1] = perm[mode][x[t]]``, and the mode is the parity of its
first token; so the next token depends on the current one and on a fact only the
sequence's start carries (the GDN states and the attention must keep it).
Training: transformers 5.2.0's own Qwen3.5 text model (the reference the e2e tests
compare with) plus the head built from its decoder layer, Adam, next-token loss plus
the head's losses over ``draft_steps`` chained passes. Pass 1's input at position
``t`` is ``[embed(x[t+1]), h[t]]`` with ``h`` the model's final (normed) hidden states;
pass ``k`` reads ``x[t+k]`` and pass ``k-1``'s output, as vLLM's proposer chains the
one head for several speculative tokens.

Deterministic for a given torch build, and independent of everything drawn before it:
the language, the training batches and the head's initial weights each come from
their own generator seeded right before use (never torch's global one), and the
language spans the word vocabulary only, so the composite's vision tokens (appended
after the words) neither enter it nor reshuffle it. Before this the language was drawn
over the whole vocabulary: when the images merge added four tokens, the model was
trained on another permutation than the one ``language_prompts`` writes, and the
head's drafts on those prompts fell from 100 % to about 80 % right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_kunlun.demo.tiny_model import SEED, SPECIAL_TOKENS
from vllm_kunlun.demo.tiny_qwen3_5 import (
    TinyQwen3_5Spec,
    _text_config,
    config,
    weights,
)

TEXT_PREFIX = "model.language_model."


@dataclass(frozen=True)
class TinyQwen3_5MtpSpec(TinyQwen3_5Spec):
    """The composite hybrid with a trained MTP head (``tiny-model --mtp``)."""

    layout: str = "composite"
    mtp_num_hidden_layers: int = 1
    train_steps: int = 90
    train_batch: int = 16
    train_length: int = 32
    learning_rate: float = 3e-3
    # Chained head passes trained (vLLM runs the one head once per speculative token).
    draft_steps: int = 3
    # 2: the language over the words only, the head's init from its own generator
    # (in the marker and the cache name: a checkpoint trained the older way is rebuilt
    # in a folder of its own, not over one another checkout still reads).
    train_format: int = 2

    @property
    def cache_name(self) -> str:
        return f"tiny-{self.model_type}-{self.layout}-mtp{self.train_format}"

    def config(self, vocab_size: int) -> dict:
        out = config(self, vocab_size)
        text = out.get("text_config", out)
        text["mtp_num_hidden_layers"] = self.mtp_num_hidden_layers
        text["mtp_use_dedicated_embeddings"] = False
        return out

    def weights(self, vocab_size: int) -> dict:
        return trained_weights(self, vocab_size)


def language(vocab_size: int | None = None, seed: int = SEED) -> Any:
    """The two successor permutations over the content tokens: ``[2, words]``
    (special tokens map to themselves; they never occur in the language). The
    language spans the tiny tokenizer's words (``vocabulary()``) whatever the model's
    vocabulary adds after them (the composite's vision tokens); ``vocab_size``, when
    given, must hold them."""
    import torch

    from vllm_kunlun.demo.tiny_model import vocabulary

    words = len(vocabulary())
    if vocab_size is not None and vocab_size < words:
        raise ValueError(f"vocab_size={vocab_size} is below the {words} words")
    gen = torch.Generator().manual_seed(seed + 7)
    first = len(SPECIAL_TOKENS)
    content = torch.arange(first, words)
    table = torch.arange(words).repeat(2, 1)
    for mode in range(2):
        table[mode, first:] = content[torch.randperm(len(content), generator=gen)]
    return table


def sample(table: Any, batch: int, length: int, gen: Any) -> Any:
    """``[batch, length]`` sequences of the language."""
    import torch

    first = len(SPECIAL_TOKENS)
    vocab = table.shape[1]
    x = torch.empty(batch, length, dtype=torch.long)
    x[:, 0] = torch.randint(first, vocab, (batch,), generator=gen)
    mode = x[:, 0] % 2
    for t in range(1, length):
        x[:, t] = table[mode, x[:, t - 1]]
    return x


def _text_model(spec: TinyQwen3_5MtpSpec, vocab_size: int, w: dict) -> Any:
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    text = _text_config(spec, vocab_size)
    cfg = Qwen3_5TextConfig(**{k: v for k, v in text.items() if k != "model_type"})
    cfg._attn_implementation = "sdpa"
    model = Qwen3_5ForCausalLM(cfg)
    state = {
        "model." + k[len(TEXT_PREFIX) :]: v
        for k, v in w.items()
        if k.startswith(TEXT_PREFIX)
    }
    state["lm_head.weight"] = w["lm_head.weight"]
    model.load_state_dict(state, strict=True)
    return model


class _Head:
    """The MTP head in transformers' modules (for training only)."""

    def __init__(self, model: Any) -> None:
        import copy

        from torch import nn
        from transformers.models.qwen3_5.modeling_qwen3_5 import (
            Qwen3_5DecoderLayer,
            Qwen3_5RMSNorm,
        )

        cfg = copy.deepcopy(model.config)
        cfg.layer_types = ["full_attention"]
        cfg.num_hidden_layers = 1
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.modules = nn.ModuleDict(
            {
                "fc": nn.Linear(2 * h, h, bias=False),
                "pre_fc_norm_embedding": Qwen3_5RMSNorm(h, eps=eps),
                "pre_fc_norm_hidden": Qwen3_5RMSNorm(h, eps=eps),
                "layer": Qwen3_5DecoderLayer(cfg, 0),
                "norm": Qwen3_5RMSNorm(h, eps=eps),
            }
        )
        self.model = model

    def forward(self, tokens: Any, hidden: Any, positions: Any) -> tuple[Any, Any]:
        """One head pass: ``tokens[t]`` with ``hidden[t]`` at ``positions[..., t]``;
        returns the head's normed output (its next pass's ``hidden``) and logits."""
        import torch

        m, base = self.modules, self.model.model
        z = m["fc"](
            torch.cat(
                [
                    m["pre_fc_norm_embedding"](base.embed_tokens(tokens)),
                    m["pre_fc_norm_hidden"](hidden),
                ],
                dim=-1,
            )
        )
        rope = base.rotary_emb(z, positions)
        z = m["layer"](
            z, position_embeddings=rope, attention_mask=None, position_ids=positions
        )
        out = m["norm"](z)
        return out, self.model.lm_head(out)

    def loss(self, x: Any, hidden: Any, steps: int) -> Any:
        """Cross-entropy of ``steps`` chained passes, as vLLM's proposer chains them:
        pass ``k`` reads token ``x[t+k]`` and pass ``k-1``'s output (pass 1: the
        model's hidden state ``h[t]``) at position ``t + k - 1`` and predicts
        ``x[t+k+1]``."""
        import torch
        import torch.nn.functional as F

        batch, length = x.shape
        total = x.new_zeros((), dtype=torch.float32)
        for k in range(1, steps + 1):
            n = length - k - 1
            if n <= 0:
                break
            hidden = hidden[:, :n]
            pos = (torch.arange(n) + (k - 1)).view(1, 1, -1).expand(3, batch, -1)
            hidden, logits = self.forward(x[:, k : k + n], hidden, pos)
            total = total + F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]),
                x[:, k + 1 : k + 1 + n].reshape(-1),
            )
        return total

    def state(self) -> dict:
        out = {}
        for name, tensor in self.modules.state_dict().items():
            top, _, rest = name.partition(".")
            key = "mtp.layers.0." + rest if top == "layer" else f"mtp.{name}"
            out[key] = tensor.detach().clone().contiguous()
        return out


def trained_weights(spec: TinyQwen3_5MtpSpec, vocab_size: int) -> dict:
    """The composite's weights after ``spec.train_steps`` steps on the language."""
    import torch
    import torch.nn.functional as F

    w = weights(spec, vocab_size)
    w.pop("mtp.fc.weight", None)  # replaced by the trained head
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # torch's global generator is left as the caller had it (fork_rng), and nothing
    # below depends on its state: every tensor of the text model comes from the
    # checkpoint (strict load), the head's initial weights are drawn right after
    # seeding it here, the language and the batches have generators of their own.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED + 13)
        head_init = torch.get_rng_state()
        try:
            model = _text_model(spec, vocab_size, w)
            torch.set_rng_state(head_init)
            head = _Head(model)
            params = list(model.parameters()) + list(head.modules.parameters())
            opt = torch.optim.Adam(params, lr=spec.learning_rate)
            table = language(vocab_size)
            gen = torch.Generator().manual_seed(SEED + 11)  # the training batches
            length = spec.train_length
            for _ in range(spec.train_steps):
                x = sample(table, spec.train_batch, length, gen)
                # The final (normed) hidden states: what vLLM's proposer hands the
                # head.
                hidden = model.model(input_ids=x, use_cache=False).last_hidden_state
                logits = model.lm_head(hidden)
                main = F.cross_entropy(
                    logits[:, :-1].reshape(-1, vocab_size), x[:, 1:].reshape(-1)
                )
                mtp = head.loss(x, hidden, spec.draft_steps)
                opt.zero_grad()
                (main + mtp).backward()
                opt.step()
        finally:
            torch.set_num_threads(threads)
    for name, tensor in model.state_dict().items():
        key = name if name == "lm_head.weight" else TEXT_PREFIX + name[len("model.") :]
        w[key] = tensor.detach().clone().contiguous()
    w.update(head.state())
    return w


def language_prompts(lengths: list[int], seed: int = 5) -> list[str]:
    """Prompts in the synthetic language (word-level text the tiny tokenizer maps back
    to the same ids), one per length: in-distribution input for tests and
    benchmarks, where the trained head's drafts are accepted."""
    import torch

    from vllm_kunlun.demo.tiny_model import vocabulary

    words = vocabulary()
    table = language()
    gen = torch.Generator().manual_seed(seed)
    rows = sample(table, len(lengths), max(lengths), gen)
    return [
        " ".join(words[i] for i in row[:n].tolist())
        for row, n in zip(rows, lengths, strict=True)
    ]
