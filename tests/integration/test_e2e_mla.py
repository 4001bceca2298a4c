"""End to end in host emulation: DeepSeek's multi-head latent attention on the plugin's
MLA backend (vllm_kunlun/ops/mla/), greedy token for token equal to transformers 5.2.0.

Tiny checkpoints written by transformers' own classes (``moe_families.py``), with
DeepSeek's MoE on vLLM's layer (the plugin's kernel): a dense first layer, shared
experts. One engine per configuration (module-scoped), each running the hybrid tests'
job list: chunked prefill (32-token budget: the long prompt in four chunks, each later
chunk attending over the cached latent context), prefix-cache hits (a warmed 40-token
prefix: two cached pages read back from the latent cache), 1-token prompts alone and
behind a long one, mixed prefill / decode batches.
- ``deepseek_v3``: DeepSeek-V3's layout (q LoRA, sigmoid grouped routing with the
  correction bias), kv_lora_rank 32, rope 16, nope 16, v_head 24, 4 heads; portable.
- ``deepseek_v2``: DeepSeek-V2-Lite's layout (no q LoRA, softmax top-k), another
  geometry (kv_lora_rank 48, rope 8, nope 24, v_head 16, 2 heads), 32-token pages, at
  tensor parallel 2 (one head per rank, the latent cache whole on both).
- ``deepseek_v3_vendor``: V3 in a third geometry with the vendor kernels asked for
  (``VLLM_KUNLUN_EMULATION_VENDOR=1``, tests/fakes): the latent cache written by
  ``concat_and_cache_mla`` and the decodes on ``fwd_kvcache_mla``.
- ``deepseek_v3_mtp``: V3 in a fourth geometry with one multi-token-prediction layer
  added to transformers' checkpoint (``moe_families.add_mtp_layer``: transformers has
  no MTP head and ignores it), served with ``deepseek_mtp`` speculative decoding, two
  drafts per step: greedy still transformers' (the target alone), drafts proposed and
  some accepted by vLLM's counters, seeded sampling through the rejection sampler on
  the plugin's kernels (no ``exponential_``), seeded requests reproducible in another
  batch (kunlun_chunked_prefill_drafts, on every model).
- ``deepseek_v3_w8a8``: V3 as a W8A8-INT8 compressed-tensors checkpoint (MLA
  projections, dense and shared MLPs, routed experts int8; ``kv_b_proj``, the router and
  lm_head float): greedy tokens and logprobs equal to a float64 reference with the same
  quantization (``w8a8_reference.py``), on the plugin's int8, MLA and MoE kernels.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration import moe_families
from tests.integration.engine_specs import (
    EMULATION,
    GREEDY_TOKENS,
    LLM_ARGS,
    SEEDED_A,
    SEEDED_B,
    TOKEN_BUDGET,
    assert_greedy_equal,
    assert_reference_not_degenerate,
    moe_paths,
    run_spec,
)
from tests.integration.hybrid_jobs import GREEDY_JOBS
from tests.integration.w8a8_reference import (
    Row,
    assert_greedy_matches,
    assert_logprobs_match,
)

pytestmark = pytest.mark.slow

RECORD_ENV = "FAKE_KUNLUN_OPS_RECORD"
V2_GEOMETRY = {"kv_lora_rank": 48, "rope": 8, "nope": 24, "v_head": 16, "heads": 2}
MTP_GEOMETRY = {"kv_lora_rank": 16, "rope": 8, "nope": 16, "v_head": 16, "heads": 4}
VENDOR_GEOMETRY = {"kv_lora_rank": 24, "rope": 8, "nope": 8, "v_head": 8, "heads": 8}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e_mla")


def _run(
    work: Path,
    name: str,
    family: str,
    llm: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    mtp: bool = False,
    extra_jobs: list[dict[str, Any]] | None = None,
    **shape: Any,
) -> dict:
    model = str(moe_families.write(family, work / name, **shape))
    if mtp:
        moe_families.add_mtp_layer(model)
    spec = {
        "backend": "vllm",
        "model": model,
        "llm": {**LLM_ARGS, **(llm or {})},
        "engine_in_process": True,
        "jobs": GREEDY_JOBS + (extra_jobs or []),
        "hf_jobs": GREEDY_JOBS,
        "hf_cache": True,
    }
    if mtp:
        # Guards Tensor.exponential_ (the rejection sampler must not draw on the host
        # path vLLM's own code takes) and records vLLM's spec-decode counters.
        spec |= {"guard_exponential": True, "metrics": True}
    return run_spec(spec, work, name, env=env, timeout=900)


@pytest.fixture(scope="module")
def deepseek_v3(work: Path) -> dict:
    return _run(work, "deepseek_v3", "deepseek_v3")


@pytest.fixture(scope="module")
def deepseek_v2(work: Path) -> dict:
    llm = {"block_size": 32, "tensor_parallel_size": 2}
    return _run(work, "deepseek_v2", "deepseek_v2", llm, **V2_GEOMETRY)


@pytest.fixture(scope="module")
def deepseek_v3_vendor(work: Path) -> dict:
    records = work / "deepseek_v3_vendor.calls.jsonl"
    env = {**EMULATION, "VLLM_KUNLUN_EMULATION_VENDOR": "1", RECORD_ENV: str(records)}
    run = _run(work, "deepseek_v3_vendor", "deepseek_v3", env=env, **VENDOR_GEOMETRY)
    run["calls"] = [
        json.loads(line) for line in records.read_text().splitlines() if line
    ]
    return run


@pytest.fixture(scope="module")
def deepseek_v3_mtp(work: Path) -> dict:
    llm = {
        "speculative_config": {"method": "deepseek_mtp", "num_speculative_tokens": 2},
        "disable_log_stats": False,  # the spec-decode counters
    }
    seeded = [SEEDED_A, SEEDED_B]
    return _run(
        work, "deepseek_v3_mtp", "deepseek_v3", llm, None, True, seeded, **MTP_GEOMETRY
    )


# W8A8-INT8 (compressed-tensors, per-channel int8 weights, per-token dynamic int8
# activations): the MLA projections, the dense and shared MLPs and the routed experts.
# kv_b_proj stays float (``ignore``): vLLM runs it as a linear layer (activations
# quantized) for prefills but dequantizes it into the absorbed W_UK / W_UV for decodes
# (activations not quantized), so with it int8 no single reference computes what the
# engine does. The router and lm_head stay float, as in released checkpoints.
W8A8_WEIGHTS = (
    r"model\.layers\.\d+\.(self_attn\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|o_proj)"
    r"|mlp\.(experts\.\d+\.|shared_experts\.)?(gate|up|down)_proj)\.weight"
)
W8A8_IGNORE = ["lm_head", "re:.*mlp.gate$", "re:.*kv_b_proj$"]
W8A8_JOBS = [
    {
        "name": job["name"],
        "requests": [
            {**r, "sampling": {**r["sampling"], "logprobs": 1}} for r in job["requests"]
        ],
    }
    for job in GREEDY_JOBS
]


@pytest.fixture(scope="module")
def deepseek_v3_w8a8(work: Path) -> dict:
    from safetensors import safe_open

    from vllm_kunlun.demo.tiny_quant import quantize_checkpoint, select

    model = moe_families.write("deepseek_v3", work / "deepseek_v3_w8a8", seed=3)
    with safe_open(str(model / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    quantize_checkpoint(model, select(names, W8A8_WEIGHTS), W8A8_IGNORE)
    spec = {
        "backend": "vllm",
        "model": str(model),
        "llm": LLM_ARGS,
        "engine_in_process": True,
        "jobs": W8A8_JOBS,
        "post": "w8a8_reference:post_float64",
    }
    run = run_spec(spec, work, "deepseek_v3_w8a8", timeout=900)
    run["int8"] = [n for n in names if n in select(names, W8A8_WEIGHTS)]
    return run


RUNS = ["deepseek_v3", "deepseek_v2", "deepseek_v3_vendor", "deepseek_v3_mtp"]


@pytest.mark.parametrize("name", RUNS)
def test_greedy_matches_transformers_token_for_token(
    name: str, request: pytest.FixtureRequest
) -> None:
    run = request.getfixturevalue(name)
    assert_greedy_equal(run, GREEDY_JOBS)
    assert_reference_not_degenerate(run)


@pytest.mark.parametrize("name", RUNS)
def test_mla_backend_served_chunked_prefill_prefix_hits_and_one_token_prompts(
    name: str, request: pytest.FixtureRequest
) -> None:
    run = request.getfixturevalue(name)
    ranks = run["serving"]
    assert len(ranks) == (2 if name == "deepseek_v2" else 1)
    for info in ranks:
        impls = info["attention_impls"]
        assert impls == ["vllm_kunlun.ops.mla.backend.PluginMLAImpl"]
        paths = {entry["path"] for entry in info["mla_kernels"]}
        assert paths == ({"vendor"} if name.endswith("vendor") else {"portable"})
    greedy = run["jobs"]["greedy"]
    assert len(greedy[2]["prompt_token_ids"]) > TOKEN_BUDGET  # chunked
    # The warmed prefix: whole pages of it came out of the latent cache.
    page = 32 if name == "deepseek_v2" else LLM_ARGS["block_size"]
    assert greedy[3]["num_cached_tokens"] >= page
    assert greedy[4]["num_cached_tokens"] >= page
    assert len(run["jobs"]["one_token_alone"][0]["prompt_token_ids"]) == 1


def test_vendor_run_wrote_the_cache_and_decoded_on_the_vendor_kernels(
    deepseek_v3_vendor: dict,
) -> None:
    calls = deepseek_v3_vendor["calls"]
    names = {c["name"] for c in calls}
    assert {"concat_and_cache_mla", "fwd_kvcache_mla"} <= names
    decodes = [c for c in calls if c["name"] == "fwd_kvcache_mla"]
    # Batched decodes: several requests in one call, the latent rows by slot index.
    widths = {tuple(c["args"]["q_c"]["shape"]) for c in decodes}
    assert any(shape[0] > 1 for shape in widths), widths
    heads, width = VENDOR_GEOMETRY["heads"], 24 + 8
    assert all(shape[1:] == (1, heads, width) for shape in widths), widths


def test_mtp_drafts_were_proposed_and_some_accepted(deepseek_v3_mtp: dict) -> None:
    # vLLM's own spec-decode counters: DeepSeekMTP proposed two drafts per decode step;
    # the hand-made head agrees with the target now and then, and whatever was accepted
    # or rejected, the greedy output above is transformers' (the target alone).
    m = deepseek_v3_mtp["metrics"]
    drafts = m["vllm:spec_decode_num_draft_tokens"]
    accepted = m["vllm:spec_decode_num_accepted_tokens"]
    per_pos = m["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert drafts >= 2 * GREEDY_TOKENS, m
    assert 0 < accepted < drafts, m
    assert len(per_pos) == 2 and per_pos[0] > 0 and sum(per_pos) == accepted, m


def test_mtp_rejection_on_the_plugins_sampler(deepseek_v3_mtp: dict) -> None:
    # Sampled requests under speculation go through vLLM's rejection sampler with the
    # plugin's kernels and recovered-token noise: vLLM's own path would have called
    # Tensor.exponential_ (guarded) and its Triton kernels (no driver here).
    assert deepseek_v3_mtp["exponential_calls"] == []
    a, b = deepseek_v3_mtp["jobs"]["seeded_a"], deepseek_v3_mtp["jobs"]["seeded_b"]
    assert all(len(r["token_ids"]) == 12 for r in a + b)
    # Seeded requests with top-k / top-p draw the same tokens in another batch.
    assert b[5]["token_ids"] == a[2]["token_ids"]
    assert b[3]["token_ids"] == a[4]["token_ids"]
    assert a[1]["token_ids"] != a[5]["token_ids"]  # another seed, other draws


def test_mtp_seeded_sampling_reproducible_in_any_batch(deepseek_v3_mtp: dict) -> None:
    # The long prompt is a prefix-cache hit in both batches but chunked differently
    # (behind a 30-token prompt in B), the short one shares steps with other company:
    # without kunlun_chunked_prefill_drafts (on every model) a request whose prefill
    # chunk was not its last got drafts verified after its prompt, drawing its
    # generator a chunking-dependent number of times (found here).
    a, b = deepseek_v3_mtp["jobs"]["seeded_a"], deepseek_v3_mtp["jobs"]["seeded_b"]
    assert b[4]["token_ids"] == a[1]["token_ids"]
    assert b[1]["token_ids"] == a[0]["token_ids"]


def _w8a8_rows(run: dict) -> list[Row]:
    post = run["post"]
    return [
        row
        for job in W8A8_JOBS
        for row in zip(
            run["jobs"][job["name"]],
            post["float64_greedy"][job["name"]],
            post["float64"][job["name"]],
            strict=True,
        )
    ]


def test_w8a8_deepseek_greedy_equals_the_float64_same_quantization_reference(
    deepseek_v3_w8a8: dict,
) -> None:
    int8 = deepseek_v3_w8a8["int8"]
    for kind in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj", "experts."):
        assert any(kind in n for n in int8), kind
    assert not any("kv_b_proj" in n for n in int8)
    rows = _w8a8_rows(deepseek_v3_w8a8)
    for got, want, _ in rows:
        if len(want) == GREEDY_TOKENS:  # the reference is not degenerate
            assert len(set(want)) > GREEDY_TOKENS // 2, want
        assert got["logprobs"], got  # one per token, compared below
    assert_greedy_matches(rows)
    assert_logprobs_match(rows)


def test_w8a8_deepseek_served_on_the_plugins_int8_and_mla_kernels(
    deepseek_v3_w8a8: dict,
) -> None:
    (info,) = deepseek_v3_w8a8["serving"]
    assert info["linear_kernels"] == [
        "vllm_kunlun.ops.int8.int8_kernel.KunlunInt8ScaledMMLinearKernel"
    ]
    assert info["attention_impls"] == ["vllm_kunlun.ops.mla.backend.PluginMLAImpl"]
    # The routed experts on the plugin's grouped-expert kernel (int8: the reference
    # above quantizes their inputs as the engine must).
    assert moe_paths(deepseek_v3_w8a8)["portable"] > 0, info["moe_kernels"]
    assert info["mla_kernels"], info
