"""End to end in host emulation: vLLM 0.15.1's engine generates through the plugin.

Every engine runs in its own interpreter (``e2e_runner.py`` or the ``vllm-kunlun demo``
command), on the tiny Qwen3 checkpoint built locally. The reference is transformers'
greedy decoding of the same checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_python
from tests.integration.engine_specs import (
    BLOCK_SIZE,
    DEMO_TOKENS,
    EMULATION,
    GREEDY_JOBS,
    GREEDY_PROMPTS,
    GREEDY_TOKENS,
    LLM_ARGS,
    LONG_PROMPT,
    PREFIX,
    SEEDED_A,
    SEEDED_B,
    TOKEN_BUDGET,
    engine_spec,
    req,
    run_demo_cli,
    run_spec,
)
from vllm_kunlun.demo.run import DEFAULT_PROMPTS
from vllm_kunlun.demo.tiny_model import write_tiny_model
from vllm_kunlun.ops.sampling import native_cpu as sampling_native

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def model_dir(work: Path) -> str:
    return str(write_tiny_model(work / "tiny-qwen3"))


@pytest.fixture(scope="module")
def run1(model_dir: str, work: Path) -> dict:
    """In-process engine (the guard covers the engine core): greedy, then seeded;
    then transformers' greedy reference in the same interpreter."""
    demo = {"name": "demo", "requests": [req(p, DEMO_TOKENS) for p in DEFAULT_PROMPTS]}
    spec = engine_spec(
        model_dir, [*GREEDY_JOBS, SEEDED_A], hf_jobs=[*GREEDY_JOBS, demo]
    )
    return run_spec(spec, work, "run1")


@pytest.fixture(scope="module")
def hf(run1: dict) -> dict:
    return run1["hf"]


@pytest.fixture(scope="module")
def run2(model_dir: str, work: Path) -> dict:
    """A second engine run: the seeded batch again, then the same seeds elsewhere."""
    spec = engine_spec(model_dir, [SEEDED_A, SEEDED_B])
    return run_spec(spec, work, "run2")


def test_tiny_model_is_not_degenerate(hf: dict) -> None:
    # An untied tiny model does not just repeat a token: the greedy test is strong.
    for row in hf["greedy"]:
        assert len(set(row["token_ids"])) >= GREEDY_TOKENS // 2, row


def test_greedy_matches_transformers_token_for_token(run1: dict, hf: dict) -> None:
    for job in ("warm_prefix", "greedy"):
        for got, want in zip(run1["jobs"][job], hf[job], strict=True):
            assert got["prompt_token_ids"] == want["prompt_token_ids"]
            assert got["token_ids"] == want["token_ids"], got["text"]


def test_chunked_prefill_and_prefix_cache_were_exercised(run1: dict) -> None:
    greedy = run1["jobs"]["greedy"]
    long_row = greedy[GREEDY_PROMPTS.index(LONG_PROMPT)]
    assert len(long_row["prompt_token_ids"]) > TOKEN_BUDGET  # needs several steps
    for i, prompt in enumerate(GREEDY_PROMPTS):
        if prompt.startswith(PREFIX):
            # At least the two full blocks of the shared 40-token prefix were reused.
            assert greedy[i]["num_cached_tokens"] >= 2 * BLOCK_SIZE, greedy[i]


def test_serving_path_is_the_plugins(run1: dict) -> None:
    (info,) = run1["serving"]
    assert (
        info["platform"]
        == "vllm_kunlun.platforms.emulation.KunlunHostEmulationPlatform"
    )
    assert info["attention_impls"] == [
        "vllm_kunlun.ops.attention.backend.PortableAttentionImpl"
    ]
    # The fakes are importable here, but without VLLM_KUNLUN_EMULATION_VENDOR=1 no
    # vendor path is taken: vLLM's CustomOps stay its own, no kernel route exists.
    assert info["custom_ops"] == {} and info["vendor_kernels"] == {}
    # Logits on the CPU: the native kernel (the extension is built by the setup).
    kernels = "native " if sampling_native.available()[0] else "portable "
    assert info["sampling_kernels"].startswith(kernels)
    # An unquantized model: no quantized linear kernel, the int8 path untouched.
    assert info["linear_kernels"] == [] and info["int8_kernels"] is None


def test_no_exponential_during_the_whole_run(run1: dict, run2: dict) -> None:
    assert run1["exponential_calls"] == []
    assert run2["exponential_calls"] == []


def test_decode_loop_uses_the_plugins_sampler(run1: dict) -> None:
    (info,) = run1["serving"]
    assert str(info["topk_topp_forward"]).startswith("vllm_kunlun."), info


def test_seeded_sampling_is_reproducible_across_engine_runs(
    run1: dict, run2: dict
) -> None:
    first, second = run1["jobs"]["seeded_a"], run2["jobs"]["seeded_a"]
    for i, r in enumerate(SEEDED_A["requests"]):
        if "seed" in r["sampling"]:
            assert first[i]["token_ids"] == second[i]["token_ids"], r


def test_seeded_sampling_ignores_the_rest_of_the_batch(run1: dict, run2: dict) -> None:
    a_reqs, b_reqs = SEEDED_A["requests"], SEEDED_B["requests"]
    a_out, b_out = run1["jobs"]["seeded_a"], run2["jobs"]["seeded_b"]
    matched = 0
    for j, rb in enumerate(b_reqs):
        for i, ra in enumerate(a_reqs):
            if "seed" in rb["sampling"] and ra == rb:
                assert b_out[j]["token_ids"] == a_out[i]["token_ids"], rb
                matched += 1
    assert matched == 4


def test_seeded_sampling_actually_samples(run1: dict, hf: dict) -> None:
    rows = run1["jobs"]["seeded_a"]
    # Different seeds, same prompt and settings: different draws.
    assert rows[1]["token_ids"] != rows[5]["token_ids"]
    # Temperature 1 over 12 tokens is not the greedy continuation.
    greedy_fox = hf["greedy"][0]["token_ids"][:12]
    assert rows[1]["token_ids"] != greedy_fox


def test_demo_runs_the_multiprocessing_engine(work: Path, hf: dict) -> None:
    """``vllm-kunlun demo --model qwen3`` on a host without Kunlun: switches to host
    emulation by itself, runs the engine core in its own (spawned) process, and
    generates the transformers greedy tokens. The default model (the log's in miniature)
    is test_e2e_w8a8_hybrid.py's."""
    # No fake torch_xmlir and no VLLM_KUNLUN_* variables: a plain CPU host.
    # --json: the engine core process logs too; stdout stays the report alone.
    report, proc = run_demo_cli(work, {}, fakes=False, json_stdout=True, model="qwen3")
    assert report["emulation"] is True
    assert "no Kunlun device detected" in report["platform_choice"]
    assert report["model"].startswith(str(work / "xdg"))
    assert report["model_kind"].startswith("tiny Qwen3 ")
    (info,) = report["serving"]
    assert report["engine_mode"] == "multiprocessing"
    assert info["pid"] != report["demo_pid"]  # the engine core ran elsewhere
    assert info["platform"].endswith("KunlunHostEmulationPlatform")
    assert any("PortableAttentionBackend" in b for b in info["attention_backends"])
    assert info["gdn_kernels"] == []  # no GDN layer, nothing reported
    got = [g["token_ids"] for g in report["generations"]]
    assert got == [row["token_ids"] for row in hf["demo"]]
    assert report["output_tokens"] == DEMO_TOKENS * len(DEFAULT_PROMPTS)
    assert report["output_tokens_per_s"] > 0
    assert "HOST EMULATION active" in proc.stderr  # the platform's banner


def test_engine_start_guard_names_the_missing_model_path(tmp_path: Path) -> None:
    # The log's case: a shorthand for a directory that exists under a longer name.
    (tmp_path / "models" / "Qwen3.8-27B-W8A8-INT8-Dynamic").mkdir(parents=True)
    proc = run_python(
        """
        from vllm import LLM
        LLM(model="models/Qwen3.8", max_model_len=256)
        """,
        env=EMULATION,
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode != 0
    assert "ModelPathError" in proc.stderr, proc.stderr[-3000:]
    assert "models/Qwen3.8-27B-W8A8-INT8-Dynamic" in proc.stderr
    assert "huggingface_hub.errors.HFValidationError" not in proc.stderr


# ---- tensor parallel 2: vLLM's multiprocessing executor, the plugin's communicator ------

TP2_UNSEEDED = {
    "name": "unseeded",
    "requests": [req(p, 8, temperature=1.0) for p in GREEDY_PROMPTS],
}


@pytest.fixture(scope="module")
def run_tp2(model_dir: str, work: Path) -> dict:
    """Two worker processes in one gloo TP group, every rank's RNG seeded differently
    (``rank_probe``); the seeded batch twice, then unseeded sampling."""
    spec = {
        "backend": "vllm",
        "model": model_dir,
        "llm": {**LLM_ARGS, "tensor_parallel_size": 2},
        "engine_in_process": True,
        "rank_probe": 5,
        "jobs": [
            *GREEDY_JOBS,
            SEEDED_A,
            {**SEEDED_A, "name": "seeded_a_again"},
            TP2_UNSEEDED,
        ],
    }
    return run_spec(spec, work, "run_tp2", timeout=600)


def test_tp2_runs_two_worker_processes_on_the_plugins_communicator(
    run_tp2: dict,
) -> None:
    serving = run_tp2["serving"]
    assert len(serving) == 2 and serving[0]["pid"] != serving[1]["pid"]
    assert all(s["platform"].endswith("KunlunHostEmulationPlatform") for s in serving)
    assert [r["rank"] for r in run_tp2["ranks"]] == [0, 1]
    for rank in run_tp2["ranks"]:
        assert (
            rank["communicator"]
            == "vllm_kunlun.platforms.communicator.KunlunCommunicator"
        )


def test_tp2_greedy_matches_tp1_and_transformers(
    run_tp2: dict, run1: dict, hf: dict
) -> None:
    for job in ("warm_prefix", "greedy"):
        rows = zip(run_tp2["jobs"][job], run1["jobs"][job], hf[job], strict=True)
        for tp2, tp1, ref in rows:
            assert tp2["prompt_token_ids"] == ref["prompt_token_ids"]
            assert tp2["token_ids"] == tp1["token_ids"] == ref["token_ids"], tp2["text"]


def test_tp2_every_rank_continues_with_rank0s_draw(run_tp2: dict) -> None:
    rank0, rank1 = (r["records"] for r in run_tp2["ranks"])
    assert len(rank0) == len(rank1) >= 12  # the seeded and unseeded sampling steps
    for r0, r1 in zip(rank0, rank1, strict=True):
        assert r0["used"] == r1["used"] == r0["own"]
    # Negative control: the ranks' RNGs really differ, so without the broadcast
    # rank 1 would have gone on with other tokens.
    assert any(r0["own"] != r1["own"] for r0, r1 in zip(rank0, rank1, strict=True))


def test_tp2_seeded_sampling_is_reproducible(run_tp2: dict) -> None:
    first, again = run_tp2["jobs"]["seeded_a"], run_tp2["jobs"]["seeded_a_again"]
    for i, r in enumerate(SEEDED_A["requests"]):
        if "seed" in r["sampling"]:
            assert first[i]["token_ids"] == again[i]["token_ids"], r
