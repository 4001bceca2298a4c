"""What README.md and docs/*.md show: their code blocks and the ``vllm-kunlun``
commands in them, parsed so that tests check the docs against the code rather than a
copy of the docs."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")


@dataclass(frozen=True)
class Command:
    doc: Path
    line: str
    argv: list[str]  # the arguments after ``vllm-kunlun``


def code_blocks(doc: Path) -> list[tuple[str, str]]:
    """``(language, text)`` of every fenced block, in order."""
    return [(m.group(1), m.group(2)) for m in _FENCE.finditer(doc.read_text())]


def _logical_lines(text: str) -> list[str]:
    return text.replace("\\\n", " ").splitlines()


def documented_serve_lines(docs: list[Path] = DOCS) -> list[Command]:
    """Every ``vllm serve ...`` line in a ``bash`` block: ``argv`` after ``vllm``."""
    found = []
    for doc in docs:
        for lang, text in code_blocks(doc):
            if lang != "bash":
                continue
            for raw in _logical_lines(text):
                if "vllm serve" not in raw:
                    continue
                words = shlex.split(raw.strip(), comments=True)
                while words and _ENV_ASSIGNMENT.match(words[0]):
                    words.pop(0)
                if words[:2] and Path(words[0]).name == "vllm" and words[1] == "serve":
                    found.append(Command(doc, raw.strip(), words[1:]))
    return found


def documented_commands(docs: list[Path] = DOCS) -> list[Command]:
    """Every ``vllm-kunlun ...`` command line in a ``bash`` block (or after ``$ `` in a
    plain block): leading ``VAR=value`` assignments, a ``.venv/bin/`` prefix and a
    trailing comment dropped; ``&&`` chains split."""
    found = []
    for doc in docs:
        for lang, text in code_blocks(doc):
            for raw in _logical_lines(text):
                line = raw.strip()
                if lang != "bash":
                    if not line.startswith("$ "):
                        continue
                    line = line[2:]
                if "vllm-kunlun" not in line:
                    continue
                for part in line.split("&&"):
                    words = shlex.split(part, comments=True)
                    while words and _ENV_ASSIGNMENT.match(words[0]):
                        words.pop(0)
                    if words and Path(words[0]).name == "vllm-kunlun":
                        found.append(Command(doc, part.strip(), words[1:]))
    return found


def block_after(doc: Path, marker: str) -> str:
    """The first fenced block after the line that contains ``marker``."""
    text = doc.read_text()
    start = text.index(marker)
    match = _FENCE.search(text, start)
    assert match, f"no code block after {marker!r} in {doc.name}"
    return match.group(2)


README_DEMO_MARKER = "**Demo** ("
README_DOCTOR_MARKER = "**Doctor** ("


def readme_demo_labels() -> set[str]:
    """The ``label : value`` lines of README's demo output block."""
    block = block_after(REPO / "README.md", README_DEMO_MARKER)
    return {m.group(1) for m in re.finditer(r"^([a-z][a-z ]*?) *: ", block, re.M)}


def readme_demo_values() -> tuple[dict[str, str], dict[str, str]]:
    """README's demo output block: ``{label: value}`` and ``{prompt: continuation}``."""
    block = block_after(REPO / "README.md", README_DEMO_MARKER)
    values = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^([A-Za-z][A-Za-z0-9 ]*?) *: (.*)$", block, re.M)
    }
    generations = dict(re.findall(r"^> (.*)\n  (.*)$", block, re.M))
    return values, generations


def readme_doctor_rows() -> tuple[list[tuple[str, str]], str]:
    """README's doctor output block: ``(STATUS, check)`` rows and the summary line."""
    block = block_after(REPO / "README.md", README_DOCTOR_MARKER)
    rows = re.findall(r"^(OK|WARN|FAIL|SKIP) +(\w+) ", block, re.M)
    return rows, block.strip().splitlines()[-1]


@dataclass(frozen=True)
class ShellStep:
    line: str
    env: dict[str, str]
    argv: list[str]  # the program's name first (``vllm-kunlun``, ``vllm``, ...)


DEPLOY_REHEARSAL = "## Rehearsal in host emulation"


def rehearsal_blocks(doc: Path = REPO / "docs" / "deploy.md") -> list[list[ShellStep]]:
    """The ``bash`` blocks of deploy.md's rehearsal section, each as its command lines
    (``VAR=value`` prefixes split off, comments dropped), in order."""
    text = doc.read_text()
    start = text.index(DEPLOY_REHEARSAL)
    end = text.find("\n## ", start + 1)
    section = text[start : end if end > 0 else len(text)]
    blocks = []
    for m in _FENCE.finditer(section):
        if m.group(1) != "bash":
            continue
        steps = []
        for raw in _logical_lines(m.group(2)):
            words = shlex.split(raw.strip(), comments=True)
            env = {}
            while words and _ENV_ASSIGNMENT.match(words[0]):
                name, _, value = words.pop(0).partition("=")
                env[name] = value
            if words:
                steps.append(ShellStep(raw.strip(), env, words))
        blocks.append(steps)
    return blocks
