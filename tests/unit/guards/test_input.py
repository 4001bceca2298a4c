"""engine_token_id_guard on vLLM 0.15.1's own InputProcessor._validate_model_input."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.v1.engine.input_processor import InputProcessor

from vllm_kunlun.guards import token_ids

VOCAB = 226


class _Tokenizer:
    """What vLLM's cached Hugging Face tokenizer reports for the tiny model: its
    ``max_token_id`` includes ``vocab_size``, a count (one past the last id)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.max_token_id = size

    def __len__(self) -> int:
        return self.size


def processor(vocab: int = VOCAB, tokenizer_len: int | None = VOCAB) -> Any:
    """The attributes ``_validate_model_input`` reads, for a text-only decoder."""
    model_config = SimpleNamespace(
        get_vocab_size=lambda: vocab,
        is_multimodal_model=False,
        max_model_len=4096,
        runner_type="generate",
    )
    tokenizer = None if tokenizer_len is None else _Tokenizer(tokenizer_len)
    return SimpleNamespace(model_config=model_config, tokenizer=tokenizer)


def validate(ids: Any, **kwargs: Any) -> None:
    InputProcessor._validate_model_input(
        processor(**kwargs),  # type: ignore[arg-type]
        {"type": "token", "prompt_token_ids": ids},  # type: ignore[arg-type]
        prompt_type="decoder",
    )


@pytest.fixture(autouse=True)
def _starts_without_the_guard() -> Iterator[None]:
    """Another test in this process (a platform hook) may have installed it: each test
    here starts from vLLM's own method and leaves the state it found."""
    was = token_ids.installed()
    token_ids.uninstall()
    yield
    if was:
        token_ids.install()


@pytest.fixture
def guard() -> Iterator[None]:
    original = InputProcessor.__dict__["_validate_model_input"]
    assert token_ids.install() is True
    assert token_ids.install() is False  # idempotent
    yield
    token_ids.uninstall()
    assert InputProcessor.__dict__["_validate_model_input"] is original


def test_vllm_alone_lets_negative_ids_and_id_equal_to_vocab_through() -> None:
    """The upstream gaps (removal of the guard: when these raise)."""
    assert not token_ids.installed()
    validate([-1, 5])
    validate([5, VOCAB])
    with pytest.raises(ValueError, match=f"Token id {VOCAB + 1} is out of vocabulary"):
        validate([5, VOCAB + 1])


@pytest.mark.parametrize(
    ("ids", "bad", "position"),
    [([-1, 5], -1, 0), ([5, VOCAB], VOCAB, 1), ([3, 4, -7, VOCAB + 9], -7, 2)],
)
def test_guard_refuses_ids_outside_the_vocabulary(
    guard: None, ids: list[int], bad: int, position: int
) -> None:
    with pytest.raises(ValueError) as err:
        validate(ids)
    assert isinstance(err.value, token_ids.TokenIdError)
    assert f"Token id {bad} at position {position} of the decoder prompt" in str(
        err.value
    )
    assert f"[0, {VOCAB})" in str(err.value)


def test_guard_accepts_the_whole_vocabulary_and_keeps_vllms_checks(guard: None) -> None:
    validate([0, VOCAB - 1, 17])
    with pytest.raises(ValueError, match="prompt cannot be empty"):
        validate([])  # vLLM's own check still runs after ours


def test_tensor_ids() -> None:
    token_ids.check_token_ids(torch.tensor([0, 5, VOCAB - 1]), VOCAB)
    with pytest.raises(token_ids.TokenIdError, match="Token id -3 at position 1"):
        token_ids.check_token_ids(torch.tensor([4, -3]), VOCAB)


def test_bound_is_the_larger_vocabulary(guard: None) -> None:
    # A tokenizer longer than the model's vocabulary (placeholder tokens), and the
    # reverse (a model with padded embedding rows, as Qwen3's 151936 > 151669).
    validate([VOCAB + 10], vocab=VOCAB, tokenizer_len=VOCAB + 20)
    validate([VOCAB + 10], vocab=VOCAB + 20, tokenizer_len=VOCAB)
    validate([VOCAB - 1], tokenizer_len=None)  # skip_tokenizer_init: model vocab
    with pytest.raises(token_ids.TokenIdError):
        validate([VOCAB], tokenizer_len=None)


def test_embeds_prompts_are_not_token_ids(guard: None) -> None:
    calls = []
    guarded = token_ids._make_guard(lambda self, inputs, prompt_type: calls.append(1))
    guarded(
        processor(),
        {"type": "embeds", "prompt_embeds": torch.zeros(2, 4)},
        prompt_type="decoder",
    )
    assert calls == [1]


def test_a_different_upstream_signature_is_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(InputProcessor, "_validate_model_input", lambda self, x: None)
    assert token_ids.install() is False
    assert not token_ids.installed()
