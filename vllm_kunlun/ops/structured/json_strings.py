r"""Runtime patch ``strict_json_strings``: a JSON-schema-constrained answer is strict
JSON (no raw control character, quote or backslash inside a string).

Why: xgrammar 0.1.29 (pinned with vLLM 0.15.1) converts a string schema with
``minLength`` / ``maxLength`` to the character class ``[^"\\\r\n]``, which admits raw
control characters (``\x00``-``\x1f`` but CR and LF: a literal tab, ``\x16``), and a
``pattern``'s ``.`` or ``\s`` to classes that admit control characters, ``"`` and
``\``. Sampled at temperature 1 over a byte-level vocabulary, a quarter of the answers
to ``{"key": {"type": "string", "maxLength": 8}}`` held such a character: strict JSON
parsers (Python's ``json.loads``) reject them. Plain ``{"type": "string"}`` is already
right (xgrammar's ``basic_string`` excludes ``\x00``-``\x1f``). Neither xgrammar nor
vLLM has an option for it.
How: ``XgrammarBackend.compile_grammar`` is wrapped. For a JSON schema (and
``json_object``) the schema is converted by xgrammar itself
(``Grammar.from_json_schema``, the same options vLLM passes), every character class of
the resulting EBNF is narrowed to characters a JSON string may hold raw (a negated class
also excludes them; a positive one loses them), except the two classes that stand
outside a string's characters -- the structural whitespace ``[ \n\t]`` and the escape
letters ``["\\/bfnrt]`` after a backslash -- and the narrowed EBNF is compiled through
vLLM's own grammar path. Regex, EBNF and choice requests are what the user wrote and
are left alone.
The same wrapper makes bounded integers exact: xgrammar 0.1.29's range rules let
``{"type": "integer", "minimum": 0, "maximum": 120}`` through to 129 and
``{"minimum": 5}`` through 1-4. Each bounded integer schema is replaced by a placeholder
constant before the conversion and its literal by an exact digit grammar after it.
Not fixed (no EBNF can express it in 0.1.29): inside a string xgrammar decodes UTF-8
leniently, so an overlong or surrogate byte sequence counts as one character and
reaches the answer as U+FFFD pairs (still valid JSON, but over a maxLength).
Installed with the engine guards (``Phase.FRONT_END``, which vLLM's general plugins
reach in the engine core, where grammars compile) and in the model process.
Removal: when the pinned xgrammar's string rules exclude control characters
(upstream xgrammar later fixed its length-bounded string rule).
"""

from __future__ import annotations

import functools
import json
import math
from types import ModuleType
from typing import Any

from vllm_kunlun.patching.attribute import AttributePatch, OptionalPatch, expect_params

NAME = "strict_json_strings"
MODULE = "vllm.v1.structured_output.backend_xgrammar"
ATTR = "XgrammarBackend.compile_grammar"

FORBIDDEN = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))
"""Code points a JSON string may not hold raw (RFC 8259 section 7)."""
OUTSIDE_STRINGS = ("[ \\n\\t]", '[\\"\\\\/bfnrt]')
"""Classes of xgrammar's JSON grammar that match structure, not string characters."""
MAX_CODE_POINT = 0x10FFFF

_SIMPLE_ESCAPES = {
    "n": 0x0A,
    "r": 0x0D,
    "t": 0x09,
    "f": 0x0C,
    "v": 0x0B,
    "a": 0x07,
    "b": 0x08,
    "0": 0x00,
}


def _parse_class(body: str) -> tuple[bool, list[tuple[int, int]]]:
    """``body`` (between ``[`` and ``]``) as (negated, ranges of code points)."""
    negated = body.startswith("^")
    chars: list[int | str] = []  # code points, and "-" for an unescaped range dash
    i = 1 if negated else 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            e = body[i + 1]
            width = {"x": 2, "u": 4, "U": 8}.get(e)
            if width is not None:
                chars.append(int(body[i + 2 : i + 2 + width], 16))
                i += 2 + width
                continue
            chars.append(_SIMPLE_ESCAPES.get(e, ord(e)))
            i += 2
            continue
        chars.append("-" if c == "-" and chars and i + 1 < len(body) else ord(c))
        i += 1
    ranges: list[tuple[int, int]] = []
    j = 0
    while j < len(chars):
        lo = chars[j]
        if lo == "-":  # a dash at an odd place is a literal dash
            lo = ord("-")
        if j + 2 < len(chars) and chars[j + 1] == "-" and chars[j + 2] != "-":
            hi = chars[j + 2]
            assert isinstance(lo, int) and isinstance(hi, int)
            ranges.append((lo, hi))
            j += 3
        else:
            assert isinstance(lo, int)
            ranges.append((lo, lo))
            j += 1
    return negated, ranges


def _normalise(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _subtract(
    ranges: list[tuple[int, int]], cut: tuple[tuple[int, int], ...]
) -> list[tuple[int, int]]:
    out = _normalise(ranges)
    for clo, chi in cut:
        kept: list[tuple[int, int]] = []
        for lo, hi in out:
            if hi < clo or lo > chi:
                kept.append((lo, hi))
                continue
            if lo < clo:
                kept.append((lo, clo - 1))
            if hi > chi:
                kept.append((chi + 1, hi))
        out = kept
    return out


def _char(cp: int) -> str:
    if 0x20 < cp < 0x7F and chr(cp) not in "\\]-^[\"'":
        return chr(cp)
    return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"


def _emit(negated: bool, ranges: list[tuple[int, int]]) -> str:
    parts = [_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in ranges]
    return "[" + ("^" if negated else "") + "".join(parts) + "]"


def narrow_class(text: str) -> str:
    """One character class (``[...]`` with its brackets) narrowed to what a JSON
    string may hold raw."""
    if text in OUTSIDE_STRINGS:
        return text
    negated, ranges = _parse_class(text[1:-1])
    if negated:
        return _emit(True, _normalise([*ranges, *FORBIDDEN]))
    kept = _subtract(ranges, FORBIDDEN)
    if not kept:  # only forbidden characters: nothing may match
        return _emit(True, [(0, MAX_CODE_POINT)])
    return _emit(False, kept)


def strict_strings_ebnf(ebnf: str) -> str:
    """xgrammar's printed EBNF of a JSON schema with every character class narrowed by
    ``narrow_class``; quoted literals are copied as they are."""
    out: list[str] = []
    i = 0
    while i < len(ebnf):
        c = ebnf[i]
        if c in "\"'":  # a literal: copy through its closing quote
            j = i + 1
            while ebnf[j] != c:
                j += 2 if ebnf[j] == "\\" else 1
            out.append(ebnf[i : j + 1])
            i = j + 1
        elif c == "[":
            j = i + 1
            while ebnf[j] != "]":
                j += 2 if ebnf[j] == "\\" else 1
            out.append(narrow_class(ebnf[i : j + 1]))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _same_length(lo: str, hi: str) -> list[str]:
    """EBNF alternatives for the digit strings of one length from ``lo`` to ``hi``."""
    if not lo:
        return [""]
    rest = len(lo) - 1
    if lo[0] == hi[0]:
        return [f'"{lo[0]}" {tail}'.strip() for tail in _same_length(lo[1:], hi[1:])]
    out = [f'"{lo[0]}" {tail}'.strip() for tail in _same_length(lo[1:], "9" * rest)]
    if int(hi[0]) - int(lo[0]) > 1:
        out.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}]" + " [0-9]" * rest)
    out += [f'"{hi[0]}" {tail}'.strip() for tail in _same_length("0" * rest, hi[1:])]
    return out


def _magnitudes(lo: int, hi: int | None) -> list[str]:
    """EBNF alternatives for the integers ``lo``..``hi`` (``None``: no end), lo >= 0,
    written without leading zeros."""
    out: list[str] = []
    digits = len(str(lo))
    while hi is None or lo <= hi:
        top = 10**digits - 1
        if hi is not None:
            top = min(top, hi)
        out += _same_length(str(lo), str(top).zfill(digits))
        lo, digits = top + 1, digits + 1
        if hi is None:  # every longer number
            out.append("[1-9]" + " [0-9]" * (digits - 1) + " [0-9]*")
            break
    return out


def integer_range_ebnf(lo: int | None, hi: int | None) -> str:
    """An EBNF expression for the JSON integers in [lo, hi] (``None``: unbounded)."""
    alts: list[str] = []
    if lo is None or lo < 0:  # negative numbers: "-" and a magnitude
        small = 1 if hi is None or hi >= 0 else -hi
        big = None if lo is None else -lo
        if big is None or small <= big:
            alts += [f'"-" {m}' for m in _magnitudes(small, big)]
    if (lo is None or lo <= 0) and (hi is None or hi >= 0):
        alts.append('"0"')
    if hi is None or hi >= 1:
        start = 1 if lo is None else max(lo, 1)
        if hi is None or start <= hi:
            alts += _magnitudes(start, hi)
    if not alts:
        raise ValueError(f"the integer range [{lo}, {hi}] is empty")
    return "(" + " | ".join(f"({a})" for a in alts) + ")"


_PLACEHOLDER = "vllm-kunlun-integer-{}"


def _bounds(node: dict) -> tuple[int | None, int | None]:
    lo = hi = None
    if isinstance(node.get("minimum"), (int, float)):
        lo = math.ceil(node["minimum"])
    if isinstance(node.get("exclusiveMinimum"), (int, float)) and not isinstance(
        node["exclusiveMinimum"], bool
    ):
        lo = max(
            lo if lo is not None else -(10**30),
            math.floor(node["exclusiveMinimum"]) + 1,
        )
    if isinstance(node.get("maximum"), (int, float)):
        hi = math.floor(node["maximum"])
    if isinstance(node.get("exclusiveMaximum"), (int, float)) and not isinstance(
        node["exclusiveMaximum"], bool
    ):
        hi = min(
            hi if hi is not None else 10**30, math.ceil(node["exclusiveMaximum"]) - 1
        )
    return lo, hi


_INTEGER_KEYS = {"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
_NOTES = {"title", "description", "default", "examples", "$comment"}


def _take_integer_ranges(node: Any, rules: list[str]) -> Any:
    """``node`` with every bounded integer schema replaced by a placeholder constant
    whose rule (``rules[i]``) is written here; anything else copied."""
    if isinstance(node, list):
        return [_take_integer_ranges(item, rules) for item in node]
    if not isinstance(node, dict):
        return node
    bounded = node.keys() & (_INTEGER_KEYS - {"type"})
    if (
        node.get("type") == "integer"
        and bounded
        and node.keys() <= _INTEGER_KEYS | _NOTES
    ):
        lo, hi = _bounds(node)
        rules.append(integer_range_ebnf(lo, hi))
        return {"const": _PLACEHOLDER.format(len(rules) - 1)}
    return {key: _take_integer_ranges(value, rules) for key, value in node.items()}


def strict_json_grammar(schema: str, *, any_whitespace: bool) -> str:
    """The EBNF vLLM's xgrammar backend would compile for ``schema``, made strict:
    strings hold no raw control character, quote or backslash, and bounded integers
    are exactly their range (xgrammar 0.1.29 lets ``maximum: 120`` through 129 and
    ``minimum: 5`` through 1-4)."""
    import xgrammar

    rules: list[str] = []
    parsed = json.loads(schema)
    replaced = json.dumps(_take_integer_ranges(parsed, rules))
    grammar = xgrammar.Grammar.from_json_schema(replaced, any_whitespace=any_whitespace)
    ebnf = strict_strings_ebnf(str(grammar))
    for i, rule in enumerate(rules):
        literal = '"\\"' + _PLACEHOLDER.format(i) + '\\""'
        assert literal in ebnf, (literal, ebnf)
        ebnf = ebnf.replace(literal, rule)
    return ebnf


def _check(module: ModuleType, original: Any) -> str | None:
    return expect_params(original, ATTR, ("self", "request_type", "grammar_spec"))


def _make(original: Any) -> Any:
    from vllm.v1.structured_output.request import StructuredOutputOptions as Options

    @functools.wraps(original)
    def compile_grammar(self: Any, request_type: Any, grammar_spec: str) -> Any:
        if request_type in (Options.JSON, Options.JSON_OBJECT):
            schema = grammar_spec
            if request_type == Options.JSON_OBJECT:
                schema = '{"type": "object"}'
            ebnf = strict_json_grammar(
                schema, any_whitespace=not self.disable_any_whitespace
            )
            return original(self, Options.GRAMMAR, ebnf)
        return original(self, request_type, grammar_spec)

    return compile_grammar


PATCH = AttributePatch(NAME, MODULE, ATTR, _make, _check)


# A vLLM whose backend differs keeps its own grammar, with a warning.
FIX = OptionalPatch(
    NAME,
    (PATCH,),
    "JSON-schema answers may hold raw control characters in length-bounded strings",
)
install, installed, uninstall, RUNTIME_PATCHES = FIX.bindings()
