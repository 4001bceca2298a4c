"""``strict_json_strings``: the narrowed grammar accepts exactly the original grammar's
strings that are strict JSON, judged by xgrammar's own matcher (the reference) and
Python's ``json`` module; and the patch goes in on vLLM's xgrammar backend and
compiles a schema request through vLLM's grammar path."""

from __future__ import annotations

import json
import random

import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string

from vllm_kunlun.ops.structured import json_strings
from vllm_kunlun.ops.structured.json_strings import (
    integer_range_ebnf,
    narrow_class,
    strict_json_grammar,
)


def _schema(prop: dict) -> str:
    return json.dumps({"type": "object", "properties": {"k": prop}, "required": ["k"]})


SCHEMAS = {
    "max_length": {"type": "string", "maxLength": 8},
    "min_length": {"type": "string", "minLength": 2},
    "pattern_dot": {"type": "string", "pattern": "^a.b.?$"},
    "pattern_space": {"type": "string", "pattern": "^x\\sy$"},
    "array_of_short": {"type": "array", "items": {"type": "string", "maxLength": 3}},
}


def _candidates(rng: random.Random) -> list[str]:
    """Texts for ``{"k": ...}``: a value spelled raw (what a sampler can emit), mixing
    letters, control characters, quotes, backslashes, escapes, non-ASCII."""
    alphabet = ["a", "b", "x", "y", " ", "\t", "\x16", "\x00", '"', "\\", "é", "\\n"]
    out = []
    for _ in range(300):
        n = rng.randint(0, 5)
        value = "".join(rng.choice(alphabet) for _ in range(n))
        out.append('{"k": "' + value + '"}')
        out.append('{"k": ["' + value + '"]}')
    out += ['{"k": "a\tb"}', '{"k": "a\x16b"}', '{"k": "a"b"}', '{"k": "x\ty"}']
    return out


def _strict(text: str) -> bool:
    try:
        json.loads(text)  # strict=True: raw control characters are errors
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_narrowed_grammar_accepts_exactly_the_strict_json_strings(name: str) -> None:
    schema = _schema(SCHEMAS[name])
    original = xgr.Grammar.from_json_schema(schema, any_whitespace=True)
    narrowed = xgr.Grammar.from_ebnf(strict_json_grammar(schema, any_whitespace=True))
    broken = 0
    for text in _candidates(random.Random(name)):
        before = _is_grammar_accept_string(original, text)
        after = _is_grammar_accept_string(narrowed, text)
        assert after == (before and _strict(text)), (name, text, before, after)
        broken += before and not _strict(text)
    if name != "array_of_short":  # its strings are too short for the bug to show
        assert broken, f"{name}: xgrammar accepted no invalid JSON: the bug is gone?"


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        ('[^\\"\\\\\\r\\n]', "[^\\u0000-\\u001f\\u0022\\u005c]"),
        ("[\\0-\\U0010ffff]", "[\\u0020-!#-\\u005b\\u005d-\\U0010ffff]"),
        ("[\\f\\n\\r\\t\\v \\xa0]", "[\\u0020\\u00a0]"),
        ("[a-c\\-]", "[\\u002da-c]"),
        ("[\\0-\\x1f]", "[^\\u0000-\\U0010ffff]"),  # nothing left: matches nothing
        ("[ \\n\\t]", "[ \\n\\t]"),  # structural whitespace, outside strings
        ('[\\"\\\\/bfnrt]', '[\\"\\\\/bfnrt]'),  # escape letters after a backslash
    ],
)
def test_narrow_class(cls: str, expected: str) -> None:
    assert narrow_class(cls) == expected


@pytest.mark.parametrize(
    ("lo", "hi"),
    [(0, 120), (5, None), (None, 50), (-20, 35), (-7, -3), (123, 4567), (0, 0)],
)
def test_integer_ranges_are_exact(lo: int | None, hi: int | None) -> None:
    grammar = xgr.Grammar.from_ebnf("root ::= " + integer_range_ebnf(lo, hi))
    for v in range(-5000, 5000, 1 if hi is not None and hi < 200 else 7):
        inside = (lo is None or lo <= v) and (hi is None or v <= hi)
        assert _is_grammar_accept_string(grammar, str(v)) == inside, v
    for text in ("01", "-0", "+1", "1.0"):
        assert not _is_grammar_accept_string(grammar, text), text


def test_bounded_integers_in_a_schema() -> None:
    """xgrammar 0.1.29 lets ``maximum: 120`` through up to 129 and ``minimum: 5``
    through 1-4; the patched grammar is exact, nested in arrays too."""
    schema = json.dumps(
        {
            "type": "object",
            "properties": {
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "n": {"type": "array", "items": {"type": "integer", "minimum": 5}},
            },
            "required": ["age", "n"],
        }
    )
    original = xgr.Grammar.from_json_schema(schema, any_whitespace=True)
    narrowed = xgr.Grammar.from_ebnf(strict_json_grammar(schema, any_whitespace=True))
    for text, ok in [
        ('{"age": 120, "n": [5, 77]}', True),
        ('{"age": 0, "n": []}', True),
        ('{"age": 121, "n": [5]}', False),
        ('{"age": 1, "n": [4]}', False),
    ]:
        assert _is_grammar_accept_string(narrowed, text) == ok, text
        if not ok:
            assert _is_grammar_accept_string(original, text), (
                "the xgrammar bug is gone?"
            )


def test_the_patch_compiles_schemas_through_vllms_grammar_path() -> None:
    """vLLM's own ``compile_grammar`` on a real xgrammar compiler: before the patch a
    raw control character goes into a length-bounded string, after it does not."""
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend
    from vllm.v1.structured_output.request import StructuredOutputOptions as Options

    vocab = [chr(c) for c in range(128)]  # one token per ASCII character

    class Backend:
        disable_any_whitespace = False
        num_speculative_tokens = 0
        vocab_size = len(vocab)
        compiler = xgr.GrammarCompiler(
            xgr.TokenizerInfo(vocab, stop_token_ids=[0]), cache_enabled=False
        )

    schema = _schema(SCHEMAS["max_length"])
    bad, good = '{"k": "a\x16', '{"k": "ab"}'

    def accepts(compile_grammar: object, text: str) -> bool:
        grammar = compile_grammar(Backend(), Options.JSON, schema)  # type: ignore[operator]
        return bool(grammar.matcher.accept_string(text))

    # vLLM's own method, whatever an earlier test in this process installed.
    was = json_strings.installed()
    json_strings.uninstall()
    original = XgrammarBackend.compile_grammar
    try:
        assert accepts(original, bad) and accepts(original, good)
        assert json_strings.install()
        patched = XgrammarBackend.compile_grammar
        assert patched is not original
        assert not accepts(patched, bad)
        assert accepts(patched, good)
        json_strings.uninstall()
        assert XgrammarBackend.compile_grammar is original
    finally:
        if was:
            json_strings.install()
