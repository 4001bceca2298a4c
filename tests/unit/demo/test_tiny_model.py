"""The tiny Qwen3 checkpoint: deterministic, untied, offline tokenizer, CLI writer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from vllm_kunlun.cli import main
from vllm_kunlun.demo import tiny_model
from vllm_kunlun.demo.run import DEFAULT_PROMPTS


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


# ---- the tiny Qwen3.5 hybrid --------------------------------------------------------------


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from vllm_kunlun.demo.tiny_qwen3_5 import LAYOUTS, TinyQwen3_5Spec

    root = tmp_path_factory.mktemp("tiny35")
    return {
        layout: tiny_model.write_tiny_model(
            root / layout, TinyQwen3_5Spec(layout=layout)
        )
        for layout in LAYOUTS
    }


def test_hybrid_layouts_as_transformers_writes_them(
    hybrid_dirs: dict[str, Path],
) -> None:
    causal = json.loads((hybrid_dirs["causal"] / "config.json").read_text())
    composite = json.loads((hybrid_dirs["composite"] / "config.json").read_text())
    assert causal["architectures"] == ["Qwen3_5ForCausalLM"]
    assert causal["model_type"] == "qwen3_5_text"
    assert composite["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert composite["model_type"] == "qwen3_5"
    text = composite["text_config"]
    assert (
        text["layer_types"]
        == causal["layer_types"]
        == [
            "linear_attention",
            "linear_attention",
            "linear_attention",
            "full_attention",
        ]
    )
    assert text["linear_num_value_heads"] > text["linear_num_key_heads"]  # GQA in GDN
    assert text["rope_parameters"]["mrope_section"] == [2, 1, 1]


def test_hybrid_layouts_share_their_text_weights(hybrid_dirs: dict[str, Path]) -> None:
    causal = load_file(str(hybrid_dirs["causal"] / "model.safetensors"))
    composite = load_file(str(hybrid_dirs["composite"] / "model.safetensors"))
    text = {
        k.replace("model.language_model.", "model."): v
        for k, v in composite.items()
        if k.startswith("model.language_model.") or k == "lm_head.weight"
    }
    assert text.keys() == causal.keys()
    # The composite's vocabulary ends with the four vision tokens: the rows before
    # them are the causal layout's, and their lm_head rows are zero (never generated).
    rows = causal["lm_head.weight"].shape[0]
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert text[name].shape[0] == rows + 4
        assert torch.equal(text[name][:rows], causal[name])
    assert not text["lm_head.weight"][rows:].any()
    assert text["model.embed_tokens.weight"][rows:].abs().sum() > 0
    assert all(
        torch.equal(text[k], causal[k])
        for k in causal
        if k not in ("model.embed_tokens.weight", "lm_head.weight")
    )
    extra = set(composite) - {k for k in composite if k.startswith("model.language_")}
    assert any(k.startswith("model.visual.blocks.0.") for k in extra)
    assert any(k.startswith("mtp.") for k in extra)
    assert not causal["lm_head.weight"].equal(causal["model.embed_tokens.weight"])


def test_transformers_loads_both_hybrid_layouts_completely(
    hybrid_dirs: dict[str, Path],
) -> None:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

    for layout, cls in (
        ("causal", Qwen3_5ForCausalLM),
        ("composite", Qwen3_5ForConditionalGeneration),
    ):
        _, info = cls.from_pretrained(
            str(hybrid_dirs[layout]), dtype=torch.float32, output_loading_info=True
        )
        assert not any(info.values()), (layout, info)  # no missing/unexpected keys


def test_hybrid_checkpoints_are_deterministic_and_kept_apart(
    hybrid_dirs: dict[str, Path], tmp_path: Path
) -> None:
    from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec

    spec = TinyQwen3_5Spec(layout="composite")
    again = tiny_model.write_tiny_model(tmp_path / "again", spec)
    assert tiny_model.checksum(again) == tiny_model.checksum(hybrid_dirs["composite"])
    assert tiny_model.is_tiny_model(again, spec)
    assert not tiny_model.is_tiny_model(again)  # not the Qwen3 one
    assert not tiny_model.is_tiny_model(again, TinyQwen3_5Spec(layout="causal"))
    assert tiny_model.default_cache_dir(spec).name == "tiny-qwen3_5-composite-v2"
    with pytest.raises(ValueError, match="layout 'vl' is not one of causal, composite"):
        TinyQwen3_5Spec(layout="vl")


def test_cli_writes_the_hybrid(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec

    target = tmp_path / "h"
    assert (
        main(["tiny-model", str(target), "--arch", "qwen3_5", "--layout", "composite"])
        == 0
    )
    assert tiny_model.is_tiny_model(target, TinyQwen3_5Spec(layout="composite"))
    assert "Qwen3_5ForConditionalGeneration" in capsys.readouterr().out
    assert main(["tiny-model", str(tmp_path / "q"), "--layout", "composite"]) == 2


def _someone_elses_model(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    real = tmp_path / "real-model"
    real.mkdir()
    files = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"w" * 64}
    for name, data in files.items():
        (real / name).write_bytes(data)
    return real, files


@pytest.mark.parametrize(
    "extra", [[], ["--arch", "qwen3_5"], ["--quant", "w8a8"]], ids=str
)
def test_cli_refuses_a_directory_it_did_not_write(
    tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str]
) -> None:
    """It used to overwrite config.json, the weights and the tokenizer silently."""
    real, files = _someone_elses_model(tmp_path)
    assert main(["tiny-model", str(real), *extra]) == 2
    err = capsys.readouterr().err
    assert f"{real} is not empty (config.json, model.safetensors)" in err
    assert "not written by vllm-kunlun tiny-model" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in real.iterdir()} == files


def test_cli_refuses_a_file_path(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    assert main(["tiny-model", str(target)]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err
    assert target.read_text() == "keep me"
    assert main(["tiny-model", str(target / "sub")]) == 2  # below a file
    assert "cannot create" in capsys.readouterr().err


def test_writers_refuse_too(tmp_path: Path) -> None:
    real, files = _someone_elses_model(tmp_path)
    with pytest.raises(tiny_model.OutputDirError, match="refusing to overwrite"):
        tiny_model.write_tiny_model(real)
    from vllm_kunlun.demo.tiny_quant import write_tiny_w8a8

    with pytest.raises(tiny_model.OutputDirError):
        write_tiny_w8a8(real)
    assert {p.name: p.read_bytes() for p in real.iterdir()} == files


def test_its_own_output_is_refreshed(tmp_path: Path) -> None:
    """Also after an interrupted build (no completion marker yet), and an empty
    directory is fine."""
    target = tmp_path / "m"
    target.mkdir()
    tiny_model.write_tiny_model(target)
    (target / tiny_model.MARKER).unlink()  # interrupted before the end
    tiny_model.write_tiny_model(target)
    assert tiny_model.is_tiny_model(target)


def test_a_truncated_cached_model_is_rebuilt_once_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache whose marker says complete but whose weights were cut (a copy that
    stopped, a full disk) used to fail every later demo with a SafetensorError."""
    from safetensors.torch import load_file

    import vllm_kunlun.logger
    from vllm_kunlun.demo.tiny_model import ensure_tiny_model, safetensors_problem

    warned: list[str] = []

    class Recorder:
        def warning(self, msg: str, *args: object) -> None:
            warned.append(msg % args)

    monkeypatch.setattr(vllm_kunlun.logger, "init_logger", lambda name: Recorder())
    cache = tmp_path / "cache"
    ensure_tiny_model(cache)
    weights = cache / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    problem = safetensors_problem(cache)
    assert problem is not None and "truncated" in problem
    from safetensors import SafetensorError

    with pytest.raises(SafetensorError):  # what the engine met
        load_file(str(weights))

    ensure_tiny_model(cache)
    assert weights.read_bytes() == good
    assert safetensors_problem(cache) is None
    assert len(warned) == 1, warned
    assert "does not load (model.safetensors: truncated" in warned[0]


@pytest.mark.parametrize(
    ("cut", "words"),
    [(0, "header does not fit"), (4, "header does not fit"), (40, "does not fit")],
)
def test_safetensors_problem_names_a_broken_header(
    tmp_path: Path, cut: int, words: str
) -> None:
    from vllm_kunlun.demo.tiny_model import safetensors_problem, write_tiny_model

    write_tiny_model(tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:cut])
    problem = safetensors_problem(tmp_path / "m")
    assert problem is not None and words in problem


def test_safetensors_problem_names_a_header_that_is_not_json(tmp_path: Path) -> None:
    from vllm_kunlun.demo.tiny_model import safetensors_problem, write_tiny_model

    write_tiny_model(tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:12] = b"!!!!"
    weights.write_bytes(bytes(data))
    problem = safetensors_problem(tmp_path / "m")
    assert problem is not None and "unreadable header" in problem
