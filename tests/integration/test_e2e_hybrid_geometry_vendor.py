"""The geometry matrix through the vendor kernels: ``VLLM_KUNLUN_EMULATION_VENDOR=1``
with the fake ``kunlun_ops`` (tests/fakes), the Kunlun attention backend serving the
48- and 400-token pages of test_e2e_hybrid_geometry.py's shapes, at tensor parallel 1
and 2, greedy token for token equal to transformers 5.2.0.

The fakes record every call (``FAKE_KUNLUN_OPS_RECORD``), from every rank's process:
the test sees the page each kernel was handed, not only the backend's name.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.integration import hybrid_geometry as geo
from tests.integration.engine_specs import EMULATION

pytestmark = pytest.mark.slow

VENDOR = {**EMULATION, "VLLM_KUNLUN_EMULATION_VENDOR": "1"}
RECORD_ENV = "FAKE_KUNLUN_OPS_RECORD"
CONFIGS = [("log27b", 1), ("narrow", 2)]
KUNLUN_IMPL = "vllm_kunlun.ops.attention.kunlun.KunlunAttentionImpl"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e_geometry_vendor")


@pytest.fixture(scope="module")
def runs(work: Path) -> dict[tuple[str, int], dict]:
    out = {}
    for geometry, tp in CONFIGS:
        records = work / f"{geometry}-tp{tp}.calls.jsonl"
        run = geo.run_geometry(
            work,
            geometry,
            tp,
            {**VENDOR, RECORD_ENV: str(records)},
            reference=True,
            name=f"{geometry}-tp{tp}-vendor",
        )
        run["calls"] = [
            json.loads(line) for line in records.read_text().splitlines() if line
        ]
        out[(geometry, tp)] = run
    return out


@pytest.mark.parametrize(("geometry", "tp"), CONFIGS)
def test_greedy_matches_transformers(
    runs: dict[tuple[str, int], dict], geometry: str, tp: int
) -> None:
    run = runs[(geometry, tp)]
    geo.assert_greedy_equal(run, run["hf"])


@pytest.mark.parametrize(("geometry", "tp"), CONFIGS)
def test_the_kunlun_backend_served_the_page(
    runs: dict[tuple[str, int], dict], geometry: str, tp: int
) -> None:
    run = runs[(geometry, tp)]
    geo.assert_paths_exercised(run, geometry, tp)
    assert len(run["serving"]) == tp
    for info in run["serving"]:
        assert info["attention_impls"] == [KUNLUN_IMPL]
        assert info["vendor_kernels"]["attention"]["native_calls"] == 0
        assert info["vendor_kernels"]["attention"]["vendor_calls"] > 0
    # Every rank called the kernels, on caches of one page per block (the Kunlun
    # layout is [blocks, kv_heads, block, head_dim]).
    calls: list[dict[str, Any]] = run["calls"]
    assert len({c["pid"] for c in calls}) == tp
    names = Counter(c["name"] for c in calls)
    assert names["paged_attention"] and names["reshape_and_cache_flash"]
    forms = Counter(
        c["args"]["is_prefix_cache"] for c in calls if c["name"] == "prefill_attention"
    )
    assert forms[True] and forms[False]  # chunks and prefix hits; fresh prompts
    for c in calls:
        if c["name"] == "paged_attention":
            assert c["args"]["k_cache"]["shape"][2] == geo.PAGES[(geometry, tp)], c
        if c["name"] == "reshape_and_cache_flash":
            assert c["args"]["key_cache"]["shape"][2] == geo.PAGES[(geometry, tp)], c
