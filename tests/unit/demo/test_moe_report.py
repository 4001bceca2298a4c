"""The demo's MoE report line: what served the routed experts and what this rank holds."""

from __future__ import annotations

from vllm_kunlun.demo.cli import moe_lines


def test_one_line_per_path_with_the_ranks_experts() -> None:
    served = [
        {"device": "cpu", "path": "portable", "reason": "no vendor", "calls": 12},
        {"device": "cpu", "path": "vendor", "reason": "loaded", "calls": 3},
    ]
    experts = {
        "num_experts": 16,
        "expert_start": 8,
        "local_experts": 8,
        "intermediate": 48,
        "quantized": True,
    }
    assert moe_lines(served, experts) == [
        "portable on cpu: experts 8..15 of 16, width 48, int8; 12 calls (no vendor)",
        "vendor on cpu: experts 8..15 of 16, width 48, int8; 3 calls (loaded)",
    ]


def test_nothing_for_a_model_without_experts() -> None:
    assert moe_lines([], None) == []
