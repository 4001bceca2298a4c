"""Check 8: which sampling implementation the active platform uses, and a probe that the
sampling noise is generated on the sampler's device."""

from __future__ import annotations

from vllm_kunlun.doctor.finding import Context, Finding


def check_sampler_path(ctx: Context) -> Finding:
    return Finding("sampler_path", "skip", "not implemented yet")
