"""Markdown tables and the pictures drawn from them, for the benchmark tests
(test_plots.py, test_moe_bench.py, test_readme_pictures.py): the first markdown table of
a text, its rows by header, whether a printed cell shows a value, a real PNG's embedded
table, and the row-for-row match of a picture's table with the printed one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def first_table(text: str) -> list[list[str]]:
    """The header and rows (separator dropped) of the first markdown table in ``text``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return [rows[0], *rows[2:]]


def cells(markdown: str) -> list[dict[str, str]]:
    """The rows of the first markdown table in ``markdown``, by header."""
    header, *body = first_table(markdown)
    return [dict(zip(header, row, strict=True)) for row in body]


def same_value(printed: str, value: float) -> bool:
    """``value`` is what ``printed`` shows, at the printed precision."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return f"{value:.{decimals}f}" == printed


def check_png(path: Path, plots: ModuleType) -> Any:
    """A real PNG of a readable size; returns the table it carries."""
    from PIL import Image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG"
        width, height = image.size
    assert 400 <= width <= 3000 and 300 <= height <= 2000
    return plots.read_table(path)


def assert_table_matches(
    embedded: Any,
    printed: list[dict[str, str]],
    label: Callable[[dict[str, str]], str],
    columns: dict[str, Callable[[dict[str, str]], str]],
) -> None:
    """Row for row, each embedded column equals the printed cell it was drawn from."""
    assert [str(row[0]) for row in embedded.rows] == [label(r) for r in printed]
    assert embedded.columns[1:] == list(columns)
    for row, shown in zip(embedded.rows, printed, strict=True):
        for value, (name, cell) in zip(row[1:], columns.items(), strict=True):
            assert same_value(cell(shown), value), (name, cell(shown), value)


def column(name: str, part: int | None = None) -> Callable[[dict[str, str]], str]:
    """The printed cell of column ``name`` (``part``: of a "median / p99" cell)."""
    return lambda row: row[name] if part is None else row[name].split(" / ")[part]
