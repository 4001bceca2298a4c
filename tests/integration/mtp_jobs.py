"""The MTP end-to-end settings and jobs other modules share (test_e2e_mtp.py,
test_e2e_mtp_w8a8.py), and the trained tiny MTP model both build once."""

from __future__ import annotations

from pathlib import Path

from tests.integration import engine_specs as e2e
from tests.integration.engine_specs import LONG_PROMPT, req
from tests.integration.sampling_reference import distribution_job
from vllm_kunlun.demo.tiny_model import default_cache_dir, ensure_tiny_model
from vllm_kunlun.demo.tiny_qwen3_5_mtp import TinyQwen3_5MtpSpec, language_prompts

GREEDY_TOKENS = 20
LLM_ARGS = {
    **e2e.LLM_ARGS,
    # vLLM 0.15.1 refuses prefix caching (mamba_cache_mode 'align') with speculative
    # decoding on hybrid models: test_prefix_caching_with_mtp_is_refused.
    "enable_prefix_caching": False,
    "disable_log_stats": False,  # the spec-decode counters
    "num_gpu_blocks_override": 64,
}
LANG = language_prompts([3, 9, 45, 6, 1, 14])
GREEDY_JOBS = [
    {
        # Mixed batch: a 45-token prompt prefilled in chunks next to decodes.
        "name": "greedy",
        "requests": [req(p, GREEDY_TOKENS) for p in LANG[:4]]
        + [req("the quick brown fox jumps over the lazy dog", GREEDY_TOKENS)],
    },
    {"name": "one_token", "requests": [req(LANG[4], GREEDY_TOKENS)]},
    {
        # A 1-token prompt queued behind a long English prompt (a decode-only batch
        # on a recycled state slot once the prefill is done).
        "name": "one_token_behind_long",
        "requests": [req(LONG_PROMPT, GREEDY_TOKENS), req("day", GREEDY_TOKENS)],
    },
]
# Greedy in the trained language alone: the head's drafts are right here (by hand, 100 %
# of the first three drafts on such prompts), so vLLM's counters after this job show
# what the draft path accepts of a head that predicts (job_acceptance).
IN_LANGUAGE = {
    "name": "in_language",
    "requests": [req(p, 24) for p in language_prompts([16, 5, 11, 16], seed=9)],
}
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
DRAFTED = "vllm:spec_decode_num_draft_tokens"


def job_acceptance(run: dict, name: str) -> tuple[int, int]:
    """(accepted, drafted) tokens of job ``name`` alone: vLLM's cumulative counters
    after it minus those after the job before it (e2e_runner's ``job_metrics``)."""
    names = list(run["job_metrics"])
    after = run["job_metrics"][name]
    i = names.index(name)
    before = run["job_metrics"][names[i - 1]] if i else {}
    return (
        int((after.get(ACCEPTED) or 0) - (before.get(ACCEPTED) or 0)),
        int((after.get(DRAFTED) or 0) - (before.get(DRAFTED) or 0)),
    )


SEEDED = req(LANG[5], 12, temperature=3.0, seed=44)
ALLOWED_IDS = [10, 11, 12]
ALLOWED_JOB = {
    # allowed_token_ids under speculation used to kill the engine core (vLLM 0.15.1
    # maps draft positions to no request): runtime patch rejection_allowed_token_ids.
    "name": "allowed_ids",
    "requests": [
        req(LANG[0], 8, allowed_token_ids=ALLOWED_IDS),
        req(LANG[2], 8),  # beside it, unrestricted
    ],
}
SEEDED_A = {
    "name": "seeded_a",
    "requests": [
        SEEDED,
        req(LANG[1], 12, temperature=4.0, top_k=50, seed=11),
        req(LANG[1], 12, temperature=4.0, top_k=50, seed=12),
    ],
}
SEEDED_B = {  # the same seeded requests with other company, in another order
    "name": "seeded_b",
    "requests": [
        req(LONG_PROMPT, 12, temperature=1.0),
        req(LANG[1], 12, temperature=4.0, top_k=50, seed=11),
        SEEDED,
    ],
}
# Sampled at temperature 1 against transformers' softmax: in-language prompts (drafts
# mostly kept) and English ones (drafts mostly rejected), 8 tokens each so that most
# come out of verify steps.
DISTRIBUTION = distribution_job(
    [LANG[0], "the quick brown fox", LANG[2], "a long river"], max_tokens=8
)


def trained_model_dir() -> Path:
    """The trained tiny MTP model in the shared cache, built once: the suite runs
    modules on two xdist workers and this one and test_e2e_mtp_w8a8.py both need it
    (a file lock keeps the two from writing the same files at once)."""
    import fcntl

    spec = TinyQwen3_5MtpSpec()
    target = default_cache_dir(spec)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return ensure_tiny_model(target, spec)
