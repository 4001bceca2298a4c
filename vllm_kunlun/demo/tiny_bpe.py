"""A tiny offline byte-level BPE tokenizer that can spell any text, with a Qwen3-style
chat template that carries tools (``<tool_call>``) and reasoning (``<think>``).

Why: the word-level tokenizer of ``tiny_model`` has no ``{``, ``"`` or digits, so a
JSON-constrained request against it can only end at once in EOS: structured output,
tool calling and the reasoning parser were never exercised. This tokenizer's base
alphabet is all 256 bytes (the GPT-2 byte-to-unicode map, as Qwen's own tokenizer),
so every string is spellable, including control characters: exactly what a test of
"the grammar never lets a raw control character into a JSON string" needs.
How: ``tokenizers``' BPE trainer runs on ``CORPUS`` (a few hundred bytes of JSON,
code-like text and words kept in this module), deterministically, so every machine
builds the same ``tokenizer.json``. The special tokens sit first (``<|endoftext|>`` id
0, ``<|im_start|>`` 1, ``<|im_end|>`` 2, the EOS of a chat turn), then the bytes and
merges, then the tool and reasoning markers as added tokens (not special: the tool and
reasoning parsers read them from the decoded text, as with Qwen3).
``BpeTokenizerSpec`` wraps any tiny model spec (dense Qwen3, Qwen3.5 hybrid) and gives
it this tokenizer (``vllm-kunlun tiny-model --tokenizer bpe``); the word-level
tokenizer stays the default for the tests that pin its outputs.
Removal: never (a test fixture); it is not a model of Qwen's real vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>")
"""Added (non-special) tokens: decoded into the text, read by vLLM's parsers."""
EOS = "<|im_end|>"
PAD = "<|endoftext|>"
TARGET_VOCAB = 640
FORMAT = 1

CORPUS = r"""
{"name": "get_weather", "arguments": {"city": "paris", "unit": "celsius"}}
{"key": "value", "id": 12, "ok": true, "items": [1, 2, 3], "none": null}
{"type": "object", "properties": {"answer": {"type": "string"}}, "required": []}
[{"a": 0.5}, {"b": -3}, {"c": "x y z"}, {"d": false}]
the quick brown fox jumps over the lazy dog. one two three four five six.
what is the weather in paris today? it is sunny and warm, twenty degrees.
<think> let me think about the question first. </think> the answer is yes.
<tool_call> {"name": "search", "arguments": {"query": "kunlun"}} </tool_call>
def main(x): return x * 2 + 1  # numbers 0123456789 and symbols !?@#$%^&*()_+-=
user assistant system tool function parameters description enum required
"""


def _train() -> Any:
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TARGET_VOCAB,
        min_frequency=2,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.strip().splitlines() * 4, trainer)
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKERS])
    return tok


# Qwen3's template, cut to what vLLM's tool and reasoning paths use: a system turn
# listing the tools, assistant turns with their reasoning and tool calls, tool results
# as user turns, and ``enable_thinking=False`` closing an empty think block.
CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}\n{{ messages[0].content }}\n{%- endif %}\n"
    "# Tools\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    "For each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{%- elif messages[0].role == 'system' -%}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' and loop.first -%}"
    "{%- elif message.role == 'assistant' -%}"
    "<|im_start|>assistant\n"
    "{%- if message.reasoning_content -%}"
    "<think>\n{{ message.reasoning_content }}\n</think>\n\n"
    "{%- endif -%}"
    "{{ message.content or '' }}"
    "{%- for call in message.tool_calls or [] -%}"
    '\n<tool_call>\n{"name": "{{ call.function.name }}", "arguments": '
    "{%- if call.function.arguments is string %} {{ call.function.arguments }}"
    "{%- else %} {{ call.function.arguments | tojson }}{%- endif -%}"
    "}\n</tool_call>"
    "{%- endfor -%}"
    "<|im_end|>\n"
    "{%- elif message.role == 'tool' -%}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "<|im_end|>\n"
    "{%- else -%}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "<think>\n\n</think>\n\n"
    "{%- endif -%}"
    "{%- endif -%}"
).replace("\n", "{{ '\\n' }}")  # whitespace control strips literal newlines


def tokenizer_json() -> str:
    """The trained tokenizer as ``tokenizer.json`` text (same bytes on every run)."""
    return str(_train().to_str(pretty=True))


def tokenizer_config() -> dict[str, Any]:
    return {
        "chat_template": CHAT_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "pad_token": PAD,
        "bos_token": None,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
    }


class BpeTokenizerSpec:
    """Any tiny model spec with this tokenizer: the inner spec's config and weights at
    this vocabulary's size, EOS ``<|im_end|>``, its own cache name and marker."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        tok = _train()
        self._json = str(tok.to_str(pretty=True))
        self.tokenizer_vocab_size = int(tok.get_vocab_size(with_added_tokens=True))

    @property
    def cache_name(self) -> str:
        return f"{self.inner.cache_name}-bpe"

    def marker(self) -> dict:
        return {**self.inner.marker(), "tokenizer": f"bpe-{FORMAT}"}

    def config(self, vocab_size: int) -> dict:
        config = dict(self.inner.config(vocab_size))
        ids = {"bos_token_id": None, "eos_token_id": SPECIAL.index(EOS)}
        ids["pad_token_id"] = SPECIAL.index(PAD)
        config.update(ids)
        if isinstance(config.get("text_config"), dict):
            config["text_config"] = {**config["text_config"], **ids}
        return config

    def weights(self, vocab_size: int) -> dict:
        return dict(self.inner.weights(vocab_size))

    def write_tokenizer(self, out: Path, write: Any) -> None:
        """``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``
        through ``write(path, bytes)`` (tiny_model's atomic writer)."""
        config = tokenizer_config()
        write(out / "tokenizer.json", self._json.encode())
        write(out / "tokenizer_config.json", _dump(config))
        special = {k: v for k, v in config.items() if k.endswith("_token") and v}
        write(out / "special_tokens_map.json", _dump(special))


def _dump(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()
