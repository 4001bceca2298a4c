"""The benchmarks' ``--plot FILE.png``: one picture of the table a benchmark prints.

Why a module of its own: matplotlib is a benchmark extra (``pip install
'vllm-kunlun[bench]'``), never a dependency of the plugin, so only this module touches
it, and a benchmark loads this module only when ``--plot`` is given. ``problem`` runs
while the arguments are parsed, so a missing matplotlib or an unwritable path is an
error (exit 2) before any engine starts, not after minutes of measuring.

The PNG carries the table it draws as JSON in a tEXt chunk (key ``TABLE_KEY``): the
picture can be checked against the printed table (the tests do) and read back later
without guessing values off the bars::

    python benchmarks/plots.py docs/img/sampler-cpu.png     # prints the embedded table
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TABLE_KEY = "vllm-kunlun-table"
INSTALL_HINT = (
    "pip install 'vllm-kunlun[bench]' (in this checkout: "
    ".venv/bin/uv pip install --python .venv/bin/python -r requirements/dev.lock)"
)


@dataclass(frozen=True)
class Table:
    """What a plot draws: ``columns[0]`` labels the rows (the x axis), the others hold
    numbers; column names are the printed table's, so the two can be compared."""

    title: str
    columns: list[str]
    rows: list[list[Any]]

    def column(self, name: str) -> list[Any]:
        i = self.columns.index(name)
        return [row[i] for row in self.rows]

    def to_json(self) -> str:
        return json.dumps(
            {"title": self.title, "columns": self.columns, "rows": self.rows}
        )

    @classmethod
    def from_json(cls, text: str) -> Table:
        data = json.loads(text)
        return cls(data["title"], data["columns"], data["rows"])


@dataclass(frozen=True)
class Panel:
    """One subplot: the table's ``columns`` drawn against its label column."""

    columns: list[str]
    ylabel: str
    log: bool = False
    labels: dict[str, str] = field(default_factory=dict)  # column -> legend text


def problem(path: Path) -> str | None:
    """Why ``--plot path`` cannot work, or None. Imports matplotlib (so a missing or
    broken install shows now) and opens the file for appending (root ignores file
    modes, so asking ``os.access`` is not enough); a file it created is removed."""
    if path.suffix.lower() != ".png":
        return f"--plot {path}: the picture is a PNG, give a path ending in .png"
    try:
        _pyplot()
    except ImportError as exc:
        return f"--plot needs matplotlib, a benchmark extra ({exc}); {INSTALL_HINT}"
    existed = path.exists()
    try:
        with path.open("ab"):
            pass
    except OSError as exc:
        return f"--plot {path}: cannot write there ({exc.strerror or exc})"
    if not existed:
        path.unlink()
    return None


def draw(path: Path, table: Table, panels: list[Panel], *, kind: str = "bars") -> Path:
    """Write ``table`` as a PNG at ``path``: grouped bars per row (``kind="bars"``) or
    lines against a numeric first column on a log axis (``kind="lines"``), one subplot
    per panel, the table itself in the PNG's metadata."""
    plt = _pyplot()
    fig, axes = plt.subplots(
        1, len(panels), figsize=(max(6.0, 4.5 * len(panels)), 4.5), squeeze=False
    )
    labels = [str(x) for x in table.column(table.columns[0])]
    for ax, panel in zip(axes[0], panels, strict=True):
        width = 0.8 / len(panel.columns)
        for j, name in enumerate(panel.columns):
            values = [float(v) for v in table.column(name)]
            legend = panel.labels.get(name, name)
            if kind == "bars":
                xs = [
                    i + (j - (len(panel.columns) - 1) / 2) * width
                    for i in range(len(values))
                ]
                ax.bar(xs, values, width, label=legend)
            else:
                ax.plot(
                    table.column(table.columns[0]), values, marker="o", label=legend
                )
        if kind == "bars":
            ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
        else:
            ax.set_xscale("log", base=2)
            ax.set_xticks(table.column(table.columns[0]), labels)
            ax.set_xlabel(table.columns[0])
        if panel.log:
            ax.set_yscale("log")
        ax.set_ylabel(panel.ylabel)
        ax.grid(axis="y", alpha=0.3, which="both")
        if len(panel.columns) > 1:
            ax.legend()
    fig.suptitle(table.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={TABLE_KEY: table.to_json()})
    plt.close(fig)
    return path


def read_table(path: Path) -> Table:
    """The table a PNG written by ``draw`` carries (Pillow ships with the stack)."""
    from PIL import Image

    with Image.open(path) as image:
        text = getattr(image, "text", {}).get(TABLE_KEY)
    if text is None:
        raise ValueError(f"{path}: no {TABLE_KEY!r} table in its metadata")
    return Table.from_json(text)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display: the benchmarks run on headless hosts
    import matplotlib.pyplot as plt

    return plt


def main(argv: list[str]) -> int:
    for name in argv:
        table = read_table(Path(name))
        print(f"{name}: {table.title}")
        print("| " + " | ".join(table.columns) + " |")
        print("|---" * len(table.columns) + "|")
        for row in table.rows:
            print("| " + " | ".join(map(str, row)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
