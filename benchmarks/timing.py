"""Interleaved timing for the kernel benchmarks: every path runs once per round, in turn,
so that a machine slowing down mid-run slows every path alike, and the median of the
rounds after the warm-up is reported. ``sync`` (e.g. ``torch.cuda.synchronize``) runs
before the clock starts and before it stops, for devices that queue work."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def interleaved_medians(
    fns: dict[str, Callable[[], Any]],
    rounds: int,
    warmup: int,
    sync: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Median seconds per call of each of ``fns`` over ``rounds`` after ``warmup``."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(warmup + rounds):
        for name, fn in fns.items():
            if sync is not None:
                sync()
            start = time.perf_counter()
            fn()
            if sync is not None:
                sync()
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}
