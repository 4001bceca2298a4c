"""The committed benchmark pictures (docs/img/) show the numbers of README.md's tables:
the table and the picture come from one run and must change together."""

from __future__ import annotations

import pytest

from tests.conftest import REPO, load_benchmark
from tests.unit.benchmarks.plot_tables import first_table, same_value


def readme_table(after: str) -> list[list[str]]:
    """The rows of the first table in README.md after ``after`` (columns by position:
    the sampler table repeats its names for 1 and 2 threads)."""
    text = (REPO / "README.md").read_text()
    return first_table(text[text.index(after) :])[1:]


@pytest.mark.parametrize(
    ("picture", "after", "columns"),
    [
        # README column index -> the picture's column
        ("sampler-cpu.png", "**Sampler probe**",
         {1: "ours ms/step", 3: "vLLM native ms/step"}),
        ("sampler-cpu-2threads.png", "**Sampler probe**",
         {5: "ours ms/step", 7: "vLLM native ms/step"}),
        ("decode-emulation.png", "**Decode at the log's scale**",
         {5: "output tok/s", 6: "decode ms/step"}),
        ("serve-emulation.png", "`python benchmarks/serve.py` runs",
         {3: "output tok/s", 5: "TTFT median ms", 6: "TPOT median ms"}),
    ],
)  # fmt: skip
def test_committed_pictures_show_the_readme_numbers(
    picture: str, after: str, columns: dict[int, str]
) -> None:
    plots = load_benchmark("sampler").load_plots()
    embedded = plots.read_table(REPO / "docs" / "img" / picture)
    printed = readme_table(after)
    assert [str(row[0]) for row in embedded.rows] == [row[0] for row in printed]
    for shown in printed:
        for index, name in columns.items():
            value = embedded.column(name)[
                [str(r[0]) for r in embedded.rows].index(shown[0])
            ]
            median = shown[index].split(" / ")[0]  # "median / p99" cells
            assert same_value(median, value), (picture, shown[0], name)
