"""The tiny Qwen3 checkpoint: deterministic, untied, offline tokenizer, CLI writer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file
from tokenizers import Tokenizer

from vllm_kunlun import tiny_model
from vllm_kunlun.cli import main
from vllm_kunlun.demo import DEFAULT_PROMPTS


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model.write_tiny_model(tmp_path_factory.mktemp("tiny"))


def test_same_bytes_on_every_build(model_dir: Path, tmp_path: Path) -> None:
    again = tiny_model.write_tiny_model(tmp_path / "again")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (again / name).read_bytes() == (model_dir / name).read_bytes(), name


def test_config_is_an_untied_qwen3(model_dir: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3"
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["tie_word_embeddings"] is False
    assert config["num_attention_heads"] > config["num_key_value_heads"]  # GQA
    weights = load_file(str(model_dir / "model.safetensors"))
    embed, head = weights["model.embed_tokens.weight"], weights["lm_head.weight"]
    assert embed.shape == head.shape == (config["vocab_size"], config["hidden_size"])
    assert not embed.equal(head)
    layers = {k.split(".")[2] for k in weights if k.startswith("model.layers.")}
    assert len(layers) == config["num_hidden_layers"] >= 2


def test_tokenizer_is_offline_and_round_trips(model_dir: Path) -> None:
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    config = json.loads((model_dir / "config.json").read_text())
    assert tok.get_vocab_size() == config["vocab_size"]
    unk = tok.token_to_id("<unk>")
    for prompt in DEFAULT_PROMPTS:
        ids = tok.encode(prompt).ids
        assert unk not in ids, prompt  # every demo word is in the vocabulary
        assert tok.decode(ids) == prompt
    assert tok.encode("zebra").ids == [unk]
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert tok.token_to_id(tok_config["eos_token"]) == config["eos_token_id"]


def test_ensure_rebuilds_only_when_incomplete(tmp_path: Path) -> None:
    target = tmp_path / "cache"
    tiny_model.ensure_tiny_model(target)
    weights = target / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    tiny_model.ensure_tiny_model(target)
    assert weights.stat().st_mtime_ns == stamp  # complete: left alone
    (target / tiny_model.MARKER).unlink()  # e.g. an interrupted build
    assert not tiny_model.is_tiny_model(target)
    tiny_model.ensure_tiny_model(target)
    assert tiny_model.is_tiny_model(target)


def test_default_cache_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert tiny_model.default_cache_dir().parent == Path("/somewhere/vllm-kunlun")


def test_cli_writes_the_model(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["tiny-model", str(tmp_path / "m")]) == 0
    assert tiny_model.is_tiny_model(tmp_path / "m")
    assert str(tmp_path / "m") in capsys.readouterr().out


def test_chat_template_renders_a_chat_without_unknown_tokens(model_dir: Path) -> None:
    """transformers renders the template (as vLLM's chat completions do)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    chat = [
        {"role": "system", "content": "be short"},
        {"role": "user", "content": "what is the sea ?"},
        {"role": "assistant", "content": "water"},
        {"role": "user", "content": "and the river"},
    ]
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == (
        "the model : be short\nyou : what is the sea ?\ni : water\nyou : and the river\ni :"
    )
    assert tok.unk_token_id not in tok(text)["input_ids"]
    without = tok.apply_chat_template(chat[:2], tokenize=False)
    assert without == "the model : be short\nyou : what is the sea ?\n"


def test_a_cache_from_before_the_chat_template_is_rebuilt(tmp_path: Path) -> None:
    target = tiny_model.write_tiny_model(tmp_path / "m")
    marker = json.loads((target / tiny_model.MARKER).read_text())
    (target / tiny_model.MARKER).write_text(json.dumps({**marker, "format": 1}))
    assert not tiny_model.is_tiny_model(target)


# The default checkpoint's sha256 (tiny_model.checksum) as built by torch 2.5.1: options
# added to the spec must leave the default model's bytes alone. Format 2 (the chat
# template) changed config.json and tokenizer_config.json only; the weights and
# tokenizer.json are the bytes of format 1.
DEFAULT_CHECKSUM = "dce9cd3dedf10a9efdab190222224c69fd3fbf059d26da14fe9b7fccebdcc915"


def test_default_model_bytes_are_unchanged(model_dir: Path) -> None:
    import torch

    config = json.loads((model_dir / "config.json").read_text())
    assert "vocab_size" not in config["vllm_kunlun_tiny"]
    if not torch.__version__.startswith("2.5.1"):
        pytest.skip(f"checksum recorded on torch 2.5.1, not {torch.__version__}")
    assert tiny_model.checksum(model_dir) == DEFAULT_CHECKSUM


def test_large_vocabulary_pads_the_tokenizer(tmp_path: Path) -> None:
    spec = tiny_model.TinyQwen3Spec(vocab_size=151_936)
    out = tiny_model.write_tiny_model(tmp_path / "big", spec)
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == 151_936
    assert config["vllm_kunlun_tiny"]["vocab_size"] == 151_936
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.get_vocab_size() == 151_936
    assert (
        tok.decode([151_935]) == f"<|extra_{151_935 - len(tiny_model.vocabulary())}|>"
    )
    prompt = DEFAULT_PROMPTS[0]  # the words keep their ids
    small = Tokenizer.from_file(
        str(tiny_model.write_tiny_model(tmp_path / "s") / "tokenizer.json")
    )
    assert tok.encode(prompt).ids == small.encode(prompt).ids
    weights = load_file(str(out / "model.safetensors"))
    assert weights["lm_head.weight"].shape == (151_936, config["hidden_size"])
    assert tiny_model.is_tiny_model(out, spec)
    assert not tiny_model.is_tiny_model(out)  # another spec: ensure_* rebuilds


def test_vocabulary_smaller_than_the_words_is_refused() -> None:
    with pytest.raises(ValueError, match="smaller than the tiny model's word list"):
        tiny_model.vocabulary(10)
