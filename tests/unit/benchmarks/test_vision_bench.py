"""benchmarks/vision.py: its arguments and how it summarizes a run."""

from __future__ import annotations

import argparse
from types import ModuleType

import pytest

from tests.conftest import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("vision")


def test_image_sizes_are_width_by_height(bench: ModuleType) -> None:
    assert bench.parse_size("64x48") == (64, 48)
    assert bench.parser().parse_args(["--image", "32X16"]).image == (32, 16)
    for bad in ("64", "x", "0x8", "a by b"):
        with pytest.raises(argparse.ArgumentTypeError, match="image size"):
            bench.parse_size(bad)


def test_summary_is_medians_and_the_image_over_text_ratio(bench: ModuleType) -> None:
    times = {"image": [4.0, 2.0, 100.0], "text": [1.0, 1.0, 3.0]}
    tokens = {
        "image": {"requests": 8, "prompt": 400, "output": 128},
        "text": {"requests": 8, "prompt": 400, "output": 128},
    }
    got = bench.summarize(times, tokens)
    assert got["image"] == {
        "median_s": 4.0,
        "requests_per_s": 2.0,
        "prompt_tok_per_s": 100.0,
        "output_tok_per_s": 32.0,
    }
    assert got["text"]["median_s"] == 1.0 and got["text"]["output_tok_per_s"] == 128.0
    assert got["ratio_image_over_text"] == {
        "requests_per_s": 0.25,
        "output_tok_per_s": 0.25,
    }
    assert "ratio_image_over_text" not in bench.summarize(
        {"text": [1.0]}, {"text": tokens["text"]}
    )
