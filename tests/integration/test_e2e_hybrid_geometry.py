"""The geometry matrix on the portable kernels: Qwen3.5 hybrids whose attention page
is not a power of two (48 and 400 tokens) in host emulation, greedy token for token
equal to transformers 5.2.0: the narrow heads at TP 1, the log's 27B heads at TP 4
(one KV head a rank, as at the log's TP 8). The vendor module
(test_e2e_hybrid_geometry_vendor.py) runs the other half: the 27B heads at TP 1 and
the narrow heads at TP 2, so each geometry runs on each path, at TP 1 and above.

One engine per configuration (module-scoped), each in its own interpreter, with its
transformers reference beside it. An engine at TP N is N + 2 processes that each import
vLLM (about a minute a process on the 2-core CI), so the matrix is kept to the cases
that differ; the tiny checkpoint's own geometry (16-token pages) is test_e2e_hybrid.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration import hybrid_geometry as geo
from tests.integration.engine_specs import EMULATION

pytestmark = pytest.mark.slow

# (geometry, tensor parallel size); the first of each geometry carries its reference.
CONFIGS = [("narrow", 1), ("log27b", 4)]
PORTABLE_IMPL = "vllm_kunlun.ops.attention.backend.PortableAttentionImpl"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e_geometry")


@pytest.fixture(scope="module")
def runs(work: Path) -> dict[tuple[str, int], dict]:
    out: dict[tuple[str, int], dict] = {}
    references: dict[str, dict] = {}
    for geometry, tp in CONFIGS:
        first = geometry not in references
        run = geo.run_geometry(
            work,
            geometry,
            tp,
            EMULATION,
            reference=first,
            name=f"{geometry}-tp{tp}",
        )
        if first:
            references[geometry] = run["hf"]
        run["reference"] = references[geometry]
        out[(geometry, tp)] = run
    return out


@pytest.mark.parametrize(("geometry", "tp"), CONFIGS)
def test_greedy_matches_transformers(
    runs: dict[tuple[str, int], dict], geometry: str, tp: int
) -> None:
    run = runs[(geometry, tp)]
    geo.assert_greedy_equal(run, run["reference"])


@pytest.mark.parametrize(("geometry", "tp"), CONFIGS)
def test_page_chunks_and_prefix_hits(
    runs: dict[tuple[str, int], dict], geometry: str, tp: int
) -> None:
    run = runs[(geometry, tp)]
    geo.assert_paths_exercised(run, geometry, tp)
    assert len(run["serving"]) == tp  # one report per rank
    for info in run["serving"]:
        assert info["attention_impls"] == [PORTABLE_IMPL]


def test_the_references_are_not_degenerate(runs: dict[tuple[str, int], dict]) -> None:
    for geometry in geo.GEOMETRIES:
        greedy = runs[(geometry, 1 if geometry == "narrow" else 4)]["reference"]
        rows = greedy["greedy"]
        assert all(len(set(r["token_ids"])) >= 4 for r in rows), rows
        assert len({tuple(r["token_ids"]) for r in rows}) == len(rows)
