"""Qwen3.5 hybrids of other head geometries than the tiny one, for the geometry matrix.

Why: vLLM sizes a hybrid's attention page so that one page holds a GDN state; with
the tiny checkpoint's heads that page is 16 tokens, a power of two that every backend
accepts, which is how a refusal of every other page size went unseen. These shapes
give pages that are not powers of two (48 and 400 tokens), one of them with the log's
27B heads (head_dim 256, 24 query / 4 KV heads, GDN 16 key / 48 value heads of 128,
conv 4) at a narrow hidden size.

Shared by test_e2e_hybrid_geometry.py (portable kernels) and
test_e2e_hybrid_geometry_vendor.py (the vendor kernels through the fakes): each module
runs its own engines (one per configuration) and its own transformers reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.engine_specs import LLM_ARGS, req, run_spec
from vllm_kunlun.demo.tiny_model import vocabulary, write_tiny_model
from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec

GEOMETRIES = {
    # Head geometry of the reproduction: 4 query / 1 KV head of 32, GDN 2 key
    # heads of 24 and 6 value heads of 16; composite layout.
    "narrow": TinyQwen3_5Spec(
        layout="composite",
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        linear_num_key_heads=2,
        linear_key_head_dim=24,
        linear_num_value_heads=6,
        linear_value_head_dim=16,
    ),
    # The log's 27B heads (its M-RoPE sections too), 4 layers at hidden 64.
    "log27b": TinyQwen3_5Spec(
        layout="causal",
        num_attention_heads=24,
        num_key_value_heads=4,
        head_dim=256,
        mrope_section=(11, 11, 10),
        linear_num_key_heads=16,
        linear_key_head_dim=128,
        linear_num_value_heads=48,
        linear_value_head_dim=128,
    ),
}
# The attention page vLLM's HybridAttentionMambaModelConfig picks at float32: 16 x
# ceil(state bytes / (16 x KV bytes per token)), per rank. narrow: a state of 3 x 192
# conv channels + 6 x 24 x 16 recurrent = 2,880 floats at TP 1, over 2 x 32 floats a
# token: 48; at TP 2 the state halves but its single KV head is replicated: 32.
# log27b: 3 x 10,240 + 48 x 128 x 128 floats over 2 x 4 x 256: 400, also at TP 2 and 4.
PAGES = {
    ("narrow", 1): 48,
    ("narrow", 2): 32,
    ("log27b", 1): 400,
    ("log27b", 2): 400,
    ("log27b", 4): 400,
}

_WORDS = [w for w in vocabulary() if w.isalpha()]


def words(n: int, stride: int, offset: int) -> str:
    return " ".join(_WORDS[(stride * i + offset) % len(_WORDS)] for i in range(n))


def jobs(page: int) -> list[dict[str, Any]]:
    """Greedy jobs: a shared prefix of two pages and a bit (prefix-cache hits of whole
    pages), then a batch of short, chunked and 1-token prompts beside those hits."""
    prefix = words(2 * page + 10, 7, 3)
    return [
        {"name": "warm_prefix", "requests": [req(prefix + " quick brown fox", 4)]},
        {
            "name": "greedy",
            "requests": [
                req("the quick brown fox jumps over the lazy dog", 12),
                req(words(page + 52, 11, 1), 12),  # prefilled in two chunks
                req("night", 12),  # a 1-token prompt
                req(prefix + " red green blue", 12),
                req(prefix + " one two three four", 12),
            ],
        },
    ]


def llm_args(geometry: str, tp: int) -> dict[str, Any]:
    page = PAGES[(geometry, tp)]
    return {
        **LLM_ARGS,
        # With prefix caching vLLM prefills a hybrid in whole pages: one page a step
        # (less never schedules a longer prompt; the platform refuses it).
        "max_num_batched_tokens": page,
        "max_model_len": 4 * page + 64,
        "tensor_parallel_size": tp,
        # Enough pages for the jobs at any TP, few enough that slots are recycled.
        "num_gpu_blocks_override": 48,
    }


def run_geometry(
    work: Path,
    geometry: str,
    tp: int,
    env: dict[str, str],
    *,
    reference: bool,
    name: str,
    extra: dict[str, Any] | None = None,
) -> dict:
    """One engine over the geometry's checkpoint (written once per ``work``); with
    ``reference`` also transformers' greedy tokens for the same jobs."""
    model = work / geometry
    if not (model / "config.json").exists():
        write_tiny_model(model, GEOMETRIES[geometry])
    page_jobs = jobs(PAGES[(geometry, 1)])
    spec: dict[str, Any] = {
        "backend": "vllm",
        "model": str(model),
        "llm": llm_args(geometry, tp),
        "jobs": page_jobs,
        # The engine core in the runner's interpreter: one process importing vLLM
        # less; the workers at TP > 1 are still processes of their own.
        "engine_in_process": True,
        **(extra or {}),
    }
    if reference:
        spec["hf_jobs"] = page_jobs
        spec["hf_cache"] = True
    return run_spec(spec, work, name, env=env, timeout=900)


def assert_greedy_equal(got: dict, want: dict) -> None:
    """Every greedy job token for token equal to the reference's."""
    for job in ("warm_prefix", "greedy"):
        for g, w in zip(got["jobs"][job], want[job], strict=True):
            assert g["prompt_token_ids"] == w["prompt_token_ids"]
            assert g["token_ids"] == w["token_ids"], (job, g["text"])


def assert_paths_exercised(run: dict, geometry: str, tp: int) -> None:
    """The page vLLM picked, kept as the kernel block, prefix hits of whole pages,
    chunked prefill."""
    page = PAGES[(geometry, tp)]
    for info in run["serving"]:
        attention = [g for g in info["kv_blocks"] if g["kind"] == "FullAttentionSpec"]
        assert attention, info["kv_blocks"]
        for group in attention:
            assert group["manager_block_size"] == page, group
            assert group["kernel_block_size"] == page, group
    greedy = run["jobs"]["greedy"]
    assert len(greedy[1]["prompt_token_ids"]) > page  # more than one step's budget
    assert len(greedy[2]["prompt_token_ids"]) == 1
    for row in greedy[3:]:
        assert row["num_cached_tokens"] >= 2 * page, row
