"""End to end in host emulation: MTP speculative decoding on the tiny Qwen3.5 composite
whose head is trained (``vllm-kunlun tiny-model --arch qwen3_5 --mtp``).

One engine per number of speculative tokens (N = 1, 2, 3), each in a fresh interpreter
with the engine core in it (so the ``exponential_`` guard sees the rejection sampler):
greedy output token for token equal to transformers 5.2.0's greedy decoding (hence equal
across N and to decoding without speculation), with chunked prefill (32-token budget),
1-token prompts, mixed prefill/decode batches, prompts in the trained language (drafts
accepted) and English ones (drafts mostly rejected: the state of the last accepted
token is what the next step starts from); seeded sampling reproducible in any batch;
acceptance from vLLM's own spec-decode counters. Configuration checks (method names,
prefix caching and other speculative methods refused) build engine configs only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_python
from tests.integration.engine_specs import (
    TOKEN_BUDGET,
    engine_spec,
    run_spec,
)
from tests.integration.mtp_jobs import (
    ALLOWED_IDS,
    ALLOWED_JOB,
    DISTRIBUTION,
    GREEDY_JOBS,
    GREEDY_TOKENS,
    IN_LANGUAGE,
    LLM_ARGS,
    SEEDED_A,
    SEEDED_B,
    job_acceptance,
    trained_model_dir,
)
from tests.integration.sampling_reference import assert_follows_reference

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir() -> str:
    return str(trained_model_dir())


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e_mtp")


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda n: f"N{n}")
def run(request: pytest.FixtureRequest, model_dir: str, work: Path) -> dict:
    n = request.param
    spec: dict[str, Any] = engine_spec(
        model_dir,
        [IN_LANGUAGE, *GREEDY_JOBS, SEEDED_A, SEEDED_B, ALLOWED_JOB, DISTRIBUTION],
        distribution=[DISTRIBUTION["name"]],
        llm={
            **LLM_ARGS,
            "speculative_config": {"method": "mtp", "num_speculative_tokens": n},
        },
        metrics=True,
    )
    result = run_spec(spec, work, f"mtp{n}", timeout=600)
    result["n"] = n
    return result


@pytest.fixture(scope="module")
def reference(model_dir: str, work: Path) -> dict:
    """transformers' greedy decoding (its own cache) on the same checkpoint."""
    spec = {"backend": "hf", "model": model_dir, "jobs": GREEDY_JOBS, "hf_cache": True}
    return dict(run_spec(spec, work, "hf", timeout=600)["jobs"])


def test_greedy_with_mtp_matches_transformers_token_for_token(
    run: dict, reference: dict
) -> None:
    hf = reference
    for job in GREEDY_JOBS:
        name = job["name"]
        for got, want in zip(run["jobs"][name], hf[name], strict=True):
            assert got["prompt_token_ids"] == want["prompt_token_ids"]
            assert got["token_ids"] == want["token_ids"], (run["n"], name, got["text"])


def test_the_shapes_were_exercised(run: dict) -> None:
    greedy = run["jobs"]["greedy"]
    # chunked prefill: drafts proposed mid-prompt would corrupt the GDN state (found
    # here; kunlun_chunked_prefill_drafts drops them)
    assert len(greedy[2]["prompt_token_ids"]) > TOKEN_BUDGET
    assert len(run["jobs"]["one_token"][0]["prompt_token_ids"]) == 1
    assert len(run["jobs"]["one_token_behind_long"][1]["prompt_token_ids"]) == 1
    # The reference is not degenerate.
    assert len(set(greedy[2]["token_ids"])) >= GREEDY_TOKENS // 2


def test_drafts_are_accepted_by_vllms_counters(run: dict) -> None:
    m = run["metrics"]
    drafts = m["vllm:spec_decode_num_draft_tokens"]
    accepted = m["vllm:spec_decode_num_accepted_tokens"]
    per_pos = m["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert drafts > 0 and 0 < accepted <= drafts, m
    assert len(per_pos) == run["n"] and per_pos[0] > 0, m
    assert sum(per_pos) == accepted


def test_in_language_drafts_are_accepted(run: dict) -> None:
    # The head predicts the language (by hand: 100 % of first one / two / three
    # drafts right on such prompts; 76-86 % before its language was fixed), and the
    # draft path computes what the head computes: at N = 1, 2, 3 every in-language
    # draft measured so far was accepted. A draft path that loses the mode (positions,
    # the hidden state handed over, the state after a rejection) falls far below.
    accepted, drafted = job_acceptance(run, IN_LANGUAGE["name"])
    assert drafted >= 4 * 20 // (run["n"] + 1) * run["n"], (accepted, drafted)
    assert accepted >= 0.95 * drafted, (run["n"], accepted, drafted)


def test_allowed_token_ids_under_speculation_masks_only_its_request(
    run: dict,
) -> None:
    restricted, free = run["jobs"]["allowed_ids"]
    assert restricted["token_ids"] and set(restricted["token_ids"]) <= set(ALLOWED_IDS)
    # The request beside it decodes as without the mask (its greedy tokens, which the
    # test above compares with transformers).
    greedy = run["jobs"]["greedy"][2]
    assert free["prompt_token_ids"] == greedy["prompt_token_ids"]
    assert free["token_ids"] == greedy["token_ids"][:8]


def test_no_exponential_during_the_run(run: dict) -> None:
    assert run["exponential_calls"] == []


def test_seeded_sampling_with_mtp_is_reproducible_in_any_batch(run: dict) -> None:
    a, b = run["jobs"]["seeded_a"], run["jobs"]["seeded_b"]
    assert b[2]["token_ids"] == a[0]["token_ids"]
    assert b[1]["token_ids"] == a[1]["token_ids"]
    assert a[1]["token_ids"] != a[2]["token_ids"]  # another seed, other draws


def test_sampling_with_mtp_follows_transformers_distribution(run: dict) -> None:
    """Seeded draws repeat (above); this says they are the model's: the tokens the
    rejection sampler emits, at temperature 1, pass a chi-square test against
    transformers' softmax of the same logits (tests/integration/sampling_reference.py).
    A sampler keeping every draft the target gives any mass fails it."""
    m = run["metrics"]
    assert m["vllm:spec_decode_num_draft_tokens"] > 0
    assert_follows_reference(run)


CONFIG_PROBE = """
import json, os
os.environ["VLLM_KUNLUN_HOST_EMULATION"] = "1"
from vllm.engine.arg_utils import EngineArgs
out = {}
for name, spec, extra in CASES:
    try:
        cfg = EngineArgs(model=MODEL, max_model_len=256, speculative_config=spec,
                         **extra).create_engine_config()
        s = cfg.speculative_config
        out[name] = {"method": s.method,
                     "arch": s.draft_model_config.architectures,
                     "num_spec": s.num_speculative_tokens,
                     "padded": not s.disable_padded_drafter_batch}
    except Exception as exc:
        out[name] = {"error": f"{type(exc).__name__}: {exc}"}
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def configs(model_dir: str) -> dict[str, Any]:
    cases = [
        ("mtp", {"method": "mtp", "num_speculative_tokens": 2}, {}),
        (
            "qwen3_next_mtp",
            {"method": "qwen3_next_mtp", "num_speculative_tokens": 1},
            {},
        ),
        ("qwen3_5_mtp", {"method": "qwen3_5_mtp", "num_speculative_tokens": 1}, {}),
        (
            "prefix_caching",
            {"method": "mtp", "num_speculative_tokens": 1},
            {"enable_prefix_caching": True},
        ),
        (
            "ngram",
            {"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_max": 2},
            {},
        ),
    ]
    code = f"MODEL = {model_dir!r}\nCASES = {cases!r}\n" + CONFIG_PROBE
    proc = run_python(code, env={"VLLM_LOGGING_LEVEL": "WARNING"}, timeout=300)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, proc.stderr[-4000:]
    return dict(json.loads(lines[-1][len("RESULT ") :]))


def test_method_names_users_try(configs: dict[str, Any]) -> None:
    assert configs["mtp"] == {
        "method": "mtp",
        "arch": ["Qwen3_5MTP"],
        "num_spec": 2,
        "padded": False,  # emulation default: the unpadded drafter batch
    }
    assert configs["qwen3_next_mtp"]["method"] == "mtp"  # vLLM's alias works too
    assert configs["qwen3_next_mtp"]["arch"] == ["Qwen3_5MTP"]
    error = configs["qwen3_5_mtp"]["error"]
    assert "'mtp'" in error  # vLLM's list of accepted methods names the right one


def test_prefix_caching_with_mtp_is_refused(configs: dict[str, Any]) -> None:
    error = configs["prefix_caching"]["error"]
    assert "prefix caching" in error and "--no-enable-prefix-caching" in error, error


def test_another_speculative_method_is_refused_at_engine_start(
    configs: dict[str, Any],
) -> None:
    # guards/qwen3_5_deployment.py, from the platform's engine-start guards: refused
    # while the engine config is built, before any engine process starts.
    error = configs["ngram"]["error"]
    assert "speculative method 'ngram' on Qwen3.5" in error, error
    assert '{"method": "mtp", "num_speculative_tokens": N}' in error, error
