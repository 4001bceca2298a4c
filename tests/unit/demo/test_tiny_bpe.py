"""The byte-level BPE tiny tokenizer, as transformers loads it: it spells any text
(JSON, control characters, non-ASCII) and gives it back, is the same on every build,
marks tools and reasoning the way vLLM's hermes and qwen3 parsers read them; and
``tiny-model --tokenizer bpe`` writes a checkpoint transformers runs."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tests.conftest import child_env
from vllm_kunlun.demo.tiny_bpe import EOS, MARKERS, BpeTokenizerSpec, tokenizer_json
from vllm_kunlun.demo.tiny_model import TinyQwen3Spec, write_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(
        tmp_path_factory.mktemp("bpe") / "m", BpeTokenizerSpec(TinyQwen3Spec())
    )


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(model_dir)


def test_same_bytes_on_every_build() -> None:
    assert tokenizer_json() == tokenizer_json()


def test_any_text_round_trips(tokenizer) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(7)
    texts = [
        json.dumps({"key": "\x16\t", "n": [1, 2.5e-3, None, True]}),
        '{"a": "\\u0000"}',
        "".join(chr(c) for c in range(0x00, 0x80)),
        "é ü 中文 🙂",
    ]
    texts += [
        "".join(chr(rng.randrange(0, 0x3000)) for _ in range(40)) for _ in range(20)
    ]
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
    control = tokenizer.encode("\x16", add_special_tokens=False)
    assert len(control) == 1  # a control character is one token the model can sample


def test_markers_are_single_decoded_tokens(tokenizer) -> None:  # type: ignore[no-untyped-def]
    for marker in MARKERS:
        (token_id,) = tokenizer.encode(marker, add_special_tokens=False)
        assert tokenizer.decode([token_id], skip_special_tokens=True) == marker
    assert tokenizer.eos_token == EOS


def test_chat_template_carries_tools_calls_and_thinking(tokenizer) -> None:  # type: ignore[no-untyped-def]
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    call = {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    text = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "ok"},
        ],
        tools=[tool],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    assert json.dumps(tool) in text
    assert '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>' in text
    assert "<tool_response>\nok\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_transformers_runs_the_checkpoint(model_dir: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    config = AutoConfig.from_pretrained(model_dir)
    assert config.vocab_size == len(tokenizer)
    assert config.eos_token_id == tokenizer.eos_token_id
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = tokenizer('{"a": 1}', return_tensors="pt").input_ids
    assert model(ids).logits.shape == (1, ids.shape[1], len(tokenizer))


def test_cli_refuses_bpe_with_quant(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_kunlun.cli",
            "tiny-model",
            str(tmp_path / "m"),
            "--tokenizer",
            "bpe",
            "--quant",
            "w8a8",
        ],
        env=child_env(fakes=False),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "--tokenizer bpe does not combine with --quant" in proc.stderr
