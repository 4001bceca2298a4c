"""A hybrid with prefix caching and a step budget below one attention page is refused
at engine start: vLLM 0.15.1's scheduler would cut every prefill chunk of a longer
prompt to 0 tokens and idle forever (found with a 48-token page and a 32-token budget).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm.v1.core.sched.scheduler import Scheduler

from vllm_kunlun.platforms.kunlun_defaults import refuse_unschedulable_prefill


def config(mode: str, page: int, budget: int) -> SimpleNamespace:
    return SimpleNamespace(
        cache_config=SimpleNamespace(mamba_cache_mode=mode, block_size=page),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=budget),
    )


def vllm_chunk(page: int, budget: int, prompt: int) -> int:
    """What vLLM's own align split schedules for a fresh prompt under ``budget``."""
    scheduler = SimpleNamespace(
        cache_config=SimpleNamespace(block_size=page), use_eagle=False
    )
    request = SimpleNamespace(
        num_output_tokens=0, num_prompt_tokens=prompt, num_computed_tokens=0
    )
    return Scheduler._mamba_block_aligned_split(scheduler, request, budget)  # type: ignore[arg-type]


def test_vllm_never_schedules_a_long_prompt_under_a_budget_below_the_page() -> None:
    # The fact the guard rests on, from vLLM's own scheduler code.
    assert vllm_chunk(page=48, budget=32, prompt=150) == 0
    assert vllm_chunk(page=400, budget=256, prompt=1000) == 0
    assert vllm_chunk(page=48, budget=48, prompt=150) == 48


@pytest.mark.parametrize(("page", "budget"), [(48, 32), (400, 256), (544, 543)])
def test_refused_naming_budget_page_and_fix(page: int, budget: int) -> None:
    with pytest.raises(ValueError) as err:
        refuse_unschedulable_prefill(config("align", page, budget))  # type: ignore[arg-type]
    msg = str(err.value)
    assert f"max_num_batched_tokens={budget}" in msg
    assert f"attention page of {page} tokens" in msg
    assert f"--max-num-batched-tokens {page}" in msg
    assert "--no-enable-prefix-caching" in msg


@pytest.mark.parametrize(
    ("mode", "page", "budget"),
    [("align", 48, 48), ("align", 400, 8192), ("none", 400, 32), ("align", 16, 32)],
)
def test_schedulable_configurations_pass(mode: str, page: int, budget: int) -> None:
    refuse_unschedulable_prefill(config(mode, page, budget))  # type: ignore[arg-type]
