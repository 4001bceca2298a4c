"""The hybrid end-to-end jobs other modules share: the tiny Qwen3.5 engine settings,
greedy jobs that exercise chunked prefill, prefix-cache hits, recycled state slots and
1-token prompts, seeded pairs for batch-independence, and the distribution job. Kept
here, not in a test file, so that test modules import helpers only."""

from __future__ import annotations

from tests.integration import engine_specs as e2e
from tests.integration.engine_specs import LONG_PROMPT, PREFIX, TOKEN_BUDGET, req
from tests.integration.sampling_reference import distribution_job
from vllm_kunlun.demo.tiny_model import vocabulary

# The Qwen3 e2e settings (32-token budget, 16-token blocks, prefix caching), with few
# blocks: the pool cycles, so new requests get slots that held older states.
LLM_ARGS = {**e2e.LLM_ARGS, "num_gpu_blocks_override": 48}
GREEDY_TOKENS = 16

_WORDS = [w for w in vocabulary() if w.isalpha()]


def words(n: int, stride: int, offset: int) -> str:
    return " ".join(_WORDS[(stride * i + offset) % len(_WORDS)] for i in range(n))


# Exactly three token budgets: its prefill ends a step on its own, and a 1-token prompt
# queued behind it first runs in a decode-only batch, on a recycled state slot.
BUDGETS_3 = words(3 * TOKEN_BUDGET, 11, 1)

GREEDY_JOBS = [
    # Puts PREFIX's blocks (and their GDN states) into the prefix cache.
    {"name": "warm_prefix", "requests": [req(PREFIX + " quick brown fox", 4)]},
    {
        # Six prompts under a 32-token budget: chunked prefills of the long ones share
        # steps with the decodes of the short ones (mixed prefill/decode batches).
        "name": "greedy",
        "requests": [
            req(p, GREEDY_TOKENS)
            for p in (
                "the quick brown fox jumps over the lazy dog",
                "one two three",
                LONG_PROMPT,
                PREFIX + " red green blue",
                PREFIX + " one two three four",
                "kunlun",
            )
        ],
    },
    {"name": "one_token_alone", "requests": [req("night", GREEDY_TOKENS)]},
    {
        "name": "one_token_behind_long",
        "requests": [req(BUDGETS_3, GREEDY_TOKENS), req("day", GREEDY_TOKENS)],
    },
]
SEEDED = req(LONG_PROMPT, 12, temperature=0.8, top_k=5, seed=44)
SEEDED_A = {
    "name": "seeded_a",
    "requests": [
        SEEDED,
        req("the quick brown fox", 12, temperature=1.0, seed=11),
        req("the quick brown fox", 12, temperature=1.0, seed=12),
        req("a long river", 12, temperature=1.0),  # no seed
    ],
}
SEEDED_B = {  # the same seeded requests with other company, in another order
    "name": "seeded_b",
    "requests": [
        req(words(30, 3, 2), 12, temperature=1.0),
        req("the quick brown fox", 12, temperature=1.0, seed=11),
        SEEDED,
    ],
}
# Temperature-1 draws against transformers' softmax (sampling_reference.py); the MoE
# and pipeline-parallel tests reuse it.
DISTRIBUTION = distribution_job(
    ["the quick brown fox", "one two three", "a long river", "night and day"]
)
