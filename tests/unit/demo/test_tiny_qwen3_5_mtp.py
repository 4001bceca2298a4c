"""The trained tiny MTP composite's language and training: the language the tests'
prompts are written in is the one the model is trained on, and training depends on
nothing drawn before it (the acceptance fall of issue 40 came from both not holding).
The quality of a full training run (100 % of first three drafts right by hand) is
measured by the MTP e2e tests through vLLM's counters, not here (it trains for 25 s)."""

from __future__ import annotations

import itertools

import pytest
import torch

import vllm_kunlun.demo.tiny_qwen3_5_mtp as mtp
from vllm_kunlun.demo.tiny_model import SPECIAL_TOKENS, vocabulary
from vllm_kunlun.demo.tiny_qwen3_5 import VISION_TOKENS
from vllm_kunlun.demo.tiny_qwen3_5_mtp import (
    TinyQwen3_5MtpSpec,
    language,
    language_prompts,
    trained_weights,
)

WORDS = vocabulary()
COMPOSITE_VOCAB = len(WORDS) + len(VISION_TOKENS)


def test_the_language_spans_the_words_whatever_the_vocabulary_adds() -> None:
    table = language(COMPOSITE_VOCAB)
    assert torch.equal(table, language())  # the vision tokens do not reshuffle it
    assert table.shape == (2, len(WORDS))
    first = len(SPECIAL_TOKENS)
    for mode in range(2):
        # A permutation of the content words: every word has one successor, and no
        # successor is a special or a vision token.
        assert sorted(table[mode, first:].tolist()) == list(range(first, len(WORDS)))
    # Two different successor functions (the mode matters).
    assert (table[0, first:] != table[1, first:]).float().mean() > 0.9


def test_the_prompts_are_written_in_the_trained_language() -> None:
    table = language(COMPOSITE_VOCAB)
    ids = {w: i for i, w in enumerate(WORDS)}
    prompts = language_prompts([16, 5, 1])
    assert [len(p.split()) for p in prompts] == [16, 5, 1]
    for prompt in prompts:
        row = [ids[w] for w in prompt.split()]
        mode = row[0] % 2
        assert all(table[mode, a] == b for a, b in itertools.pairwise(row))


def test_training_ignores_the_global_random_state() -> None:
    spec = TinyQwen3_5MtpSpec(train_steps=1)
    torch.manual_seed(0)
    first = trained_weights(spec, COMPOSITE_VOCAB)
    torch.manual_seed(1)
    torch.rand(1000)  # whatever the caller drew before
    after = torch.get_rng_state()
    second = trained_weights(spec, COMPOSITE_VOCAB)
    assert torch.equal(torch.get_rng_state(), after)  # and leaves it as it was
    assert first.keys() == second.keys()
    assert any(k.startswith("mtp.layers.0.") for k in first)
    for name in first:
        assert torch.equal(first[name], second[name]), name


def test_the_vision_tower_does_not_move_the_text_model_or_the_head(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Another tower (here: every tower weight shifted by one) leaves the trained text
    # weights and the head bit for bit as they were.
    spec = TinyQwen3_5MtpSpec(train_steps=1)
    w = trained_weights(spec, COMPOSITE_VOCAB)
    visual = {k for k in w if k.startswith("model.visual.")}
    assert visual
    real = mtp.weights
    monkeypatch.setattr(
        mtp,
        "weights",
        lambda s, v: {k: t + 1.0 if k in visual else t for k, t in real(s, v).items()},
    )
    moved = trained_weights(spec, COMPOSITE_VOCAB)
    assert not torch.equal(moved[min(visual)], w[min(visual)])
    for name in w.keys() - visual:
        assert torch.equal(w[name], moved[name]), name
