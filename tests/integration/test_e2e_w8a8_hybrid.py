"""End to end in host emulation: the log's model in miniature, a Qwen3.5 vision-language
composite (hybrid: Gated DeltaNet + gated full attention) whose text linears are
compressed-tensors W8A8-INT8 (dynamic), the vision tower, the MTP head and lm_head
left in float, as ``vllm-kunlun tiny-model --arch qwen3_5 --layout composite --quant
w8a8`` writes it.

Two engines (the int8 kernel must be found in spawned processes too): the tiny
composite at TP 1 with its engine core in a process of its own, and the narrow heads of the geometry matrix
(hybrid_geometry.py: 1 KV head, GDN 2 key heads of 24 and 6 value heads of 16) at TP 2,
whose int8 projections and scales are sharded across two worker processes and whose
page is 32 tokens (48 at TP 1). Reference (``w8a8_reference.post_float64``): transformers' own Qwen3.5 text model
in float64 on the checkpoint's int8 weights x scales, with vLLM's per-token activation
quantization (``absmax / 127``) in front of every quantized linear; greedy and
teacher-forced logprobs over the same prompts (chunked prefill, prefix-cache hits, a
one-token prompt). The tolerances are the dense W8A8 test's (test_e2e_w8a8.py): the
quantization grids are the same, so only float noise across an int8 rounding boundary
can move a logprob.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open

from tests.docs_blocks import readme_demo_values
from tests.integration import hybrid_geometry as geo
from tests.integration.engine_specs import (
    DEMO_TOKENS,
    GREEDY_PROMPTS,
    PREFIX,
    req,
    run_demo_cli,
    run_spec,
)
from tests.integration.hybrid_jobs import LLM_ARGS, words
from tests.integration.w8a8_reference import (
    Row,
    assert_greedy_matches,
    assert_logprobs_match,
)
from vllm_kunlun.demo.run import DEFAULT_PROMPTS
from vllm_kunlun.demo.tiny_model import checksum
from vllm_kunlun.demo.tiny_quant import write_tiny_w8a8
from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec

pytestmark = pytest.mark.slow

TOKENS = 16
# PREFIX's pages (and their GDN states) in the prefix cache first: the greedy prompts
# then hit them (test_e2e_hybrid.py does the same on the float checkpoint).
WARM = {"name": "warm_prefix", "requests": [req(PREFIX + " quick brown fox", 4)]}
JOB = {
    "name": "greedy",
    "requests": [req(p, TOKENS, logprobs=1) for p in GREEDY_PROMPTS],
}
# Two prompts sharing a prefix that is not cached yet, prefilled in one batch behind a
# third request: vLLM 0.15.1 lets the last one hit the prefix pages the second computes
# in that same step (runtime patch kunlun_mamba_cache_written).
FRESH = words(40, 7, 5)
BURST = {
    "name": "shared_prefix_burst",
    "requests": [
        req(p, TOKENS, logprobs=1)
        for p in ("kunlun engine", FRESH + " red green blue", FRESH + " one two three")
    ],
}

# `vllm-kunlun demo`'s prompts at the demo's length: the default demo serves the tiny
# composite W8A8, this module's tiny_tp1 checkpoint.
DEMO = {"name": "demo", "requests": [req(p, DEMO_TOKENS) for p in DEFAULT_PROMPTS]}


# (checkpoint spec, engine arguments) per configuration.
CONFIGS = {
    "tiny_tp1": (TinyQwen3_5Spec(layout="composite"), LLM_ARGS),
    # Four pages a step: room for the burst's three prefills in one step.
    "narrow_tp2": (
        geo.GEOMETRIES["narrow"],
        {**geo.llm_args("narrow", 2), "max_num_batched_tokens": 128},
    ),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def config(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, config: str) -> str:
    out = tmp_path_factory.mktemp(f"e2e-w8a8-{config}") / "model"
    return str(write_tiny_w8a8(out, CONFIGS[config][0]))


@pytest.fixture(scope="module")
def run(model_dir: str, config: str) -> dict[str, Any]:
    spec = {
        "backend": "vllm",
        "model": model_dir,
        "llm": CONFIGS[config][1],
        # The tiny composite's engine core is a process of its own (the int8 kernel
        # must be found in a spawned engine core too); at TP 2 the core stays in the
        # runner (one process importing vLLM less) and the kernel runs in the workers.
        "engine_in_process": config == "narrow_tp2",
        "jobs": [WARM, JOB, BURST, *([DEMO] if config == "tiny_tp1" else [])],
        "post": "w8a8_reference:post_float64",
    }
    return run_spec(spec, Path(model_dir).parent, config, timeout=900)


def _rows(run: dict[str, Any], job: str = "greedy") -> list[Row]:
    post = run["post"]
    return list(
        zip(
            run["jobs"][job],
            post["float64_greedy"][job],
            post["float64"][job],
            strict=True,
        )
    )


def test_the_checkpoint_is_the_logs_format(model_dir: str) -> None:
    """Every text linear int8 with a scale (GDN, attention, MLP); the vision tower, the
    MTP head and lm_head float, and the config says so."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    quant = config["quantization_config"]
    assert quant["quant_method"] == "compressed-tensors"
    assert quant["format"] == "int-quantized"
    with safe_open(str(Path(model_dir) / "model.safetensors"), "pt") as f:
        dtypes = {name: f.get_slice(name).get_dtype() for name in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    int8 = {n for n, d in dtypes.items() if d == "I8"}
    for kind in ("linear_attn.in_proj_qkv", "linear_attn.out_proj", "self_attn.q_proj"):
        assert any(kind in n for n in int8), kind
    assert all(n.removesuffix(".weight") + ".weight_scale" in dtypes for n in int8)
    assert not any(n.startswith(("model.visual.", "mtp.", "lm_head")) for n in int8)
    assert any(n.startswith("model.visual.") for n in dtypes)


def test_the_plugins_int8_kernel_served_the_text_linears(
    run: dict, config: str
) -> None:
    ranks = run["serving"]
    assert len(ranks) == CONFIGS[config][1].get("tensor_parallel_size", 1)
    for info in ranks:
        assert info["linear_kernels"] == [
            "vllm_kunlun.ops.int8.int8_kernel.KunlunInt8ScaledMMLinearKernel"
        ]
        assert info["int8_kernels"].startswith("portable (")


def test_the_reference_is_not_degenerate(run: dict) -> None:
    for _, want, _ in _rows(run):
        assert len(set(want)) > 3, want


def test_greedy_equals_the_float64_same_quantization_reference(run: dict) -> None:
    assert_greedy_matches(_rows(run))


def test_logprobs_match_the_same_quantization_reference(run: dict) -> None:
    assert_logprobs_match(_rows(run))


def test_a_shared_prefix_burst_equals_the_reference(run: dict) -> None:
    """Without the runtime patch kunlun_mamba_cache_written the third request
    hits the second's prefix pages in the same step, before their GDN state exists, and
    is wrong from its first token (logprob gaps up to 3.3 nats)."""
    rows = _rows(run, "shared_prefix_burst")
    assert_greedy_matches(rows, misses=0)
    assert_logprobs_match(rows)


@pytest.fixture(scope="module")
def default_demo(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict, Any]:
    """``vllm-kunlun demo`` with no model argument, on a plain CPU host (no fakes, no
    VLLM_KUNLUN_* variables), in text mode: the report as a user sees it."""
    work = tmp_path_factory.mktemp("default-demo")
    return run_demo_cli(work, {}, fakes=False)


def test_the_default_demo_serves_the_logs_model_in_miniature(
    default_demo: tuple[dict, Any], run: dict, config: str, model_dir: str
) -> None:
    """The demo's default model is this module's tiny composite W8A8 (same bytes),
    every kind of layer is reported with the kernel that served it, and its greedy
    tokens are the same-quantization reference's."""
    if config != "tiny_tp1":
        pytest.skip("the default demo serves the tiny composite at TP 1")
    report, proc = default_demo
    assert checksum(report["model"]) == checksum(model_dir)
    assert report["model_kind"].startswith("the deployment log's model in miniature")
    assert report["engine_mode"] == "multiprocessing"
    (info,) = report["serving"]
    assert info["pid"] != report["demo_pid"]
    assert info["platform"].endswith("KunlunHostEmulationPlatform")
    assert info["attention_impls"] == [
        "vllm_kunlun.ops.attention.backend.PortableAttentionImpl"
    ]
    served = {(c["op"], c["path"]) for c in info["gdn_kernels"]}
    assert {op for op, _ in served} == {
        "fused_gdn_gating",
        "causal_conv1d_fn",
        "causal_conv1d_update",
        "chunk_gated_delta_rule",
        "fused_recurrent_gated_delta_rule",
    }
    assert {path for _, path in served} == {"portable"}  # emulation, no Triton
    assert info["int8_kernels"].startswith("portable (")
    assert info["topk_topp_forward"].startswith("vllm_kunlun.")
    post = run["post"]
    rows = list(
        zip(
            report["generations"],
            post["float64_greedy"]["demo"],
            post["float64"]["demo"],
            strict=True,
        )
    )
    for g, engine_row in zip(report["generations"], run["jobs"]["demo"], strict=True):
        assert g["prompt_token_ids"] == engine_row["prompt_token_ids"]
    assert_greedy_matches(rows)
    # The text report names each layer kind on its own line.
    for label in ("attention", "GDN kernels", "int8 kernels", "sampler"):
        assert re.search(rf"^{label} +: \S", proc.stdout, re.M), label

    # README's pasted demo output holds today's values: what served, and the greedy
    # continuations (README's run decoded more tokens: today's are their start).
    values, generations = readme_demo_values()
    isa = re.compile(r"\((\w+) kernels\)")
    assert values["platform"].startswith(info["platform"])
    assert values["attention"] == ", ".join(info["attention_backends"])
    assert values["sampler"] == info["topk_topp_forward"]
    assert values["int8 kernels"] == info["int8_kernels"]
    assert isa.sub("(<isa>)", values["sampling kernels"]) == isa.sub(
        "(<isa>)", info["sampling_kernels"]
    )
    assert list(generations) == list(DEFAULT_PROMPTS)
    for g in report["generations"]:
        assert generations[g["prompt"]].startswith(g["text"].strip()), g
