"""argparse types for the numeric options of ``vllm-kunlun``: checked at parsing; and
the ``--json`` flag every reporting command shares.

Why: ``float("nan")``, ``inf`` and negative numbers all parse as floats. Unchecked,
``--device-memory-gib nan`` crashed the doctor, ``-5`` advised a utilization of 2.20,
``0`` silently meant "ask the device", and ``--lock-timeout nan`` waited forever. Each
type here refuses what does not have the option's meaning, so argparse prints the
option, the value and what is accepted, and exits 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _number(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{raw!r} is not a finite number")
    return value


def _integer(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not an integer") from None


def int_range(minimum: int, maximum: int) -> Callable[[str], int]:
    """An integer in [minimum, maximum]."""

    def parse(raw: str) -> int:
        value = _integer(raw)
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"{raw} is out of range (an integer from {minimum} to {maximum})"
            )
        return value

    parse.__name__ = "integer"  # argparse names the type in "invalid <name> value"
    return parse


def _float_from_zero(zero_ok: bool, maximum: float) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        value = _number(raw)
        if not (value >= 0 if zero_ok else value > 0) or value > maximum:
            raise argparse.ArgumentTypeError(
                f"{raw} is not a number {'>=' if zero_ok else '>'} 0"
                + (f" and <= {maximum:g}" if math.isfinite(maximum) else "")
            )
        return value

    parse.__name__ = "number"  # argparse names the type in "invalid <name> value"
    return parse


def positive_float(maximum: float = math.inf) -> Callable[[str], float]:
    """A finite number > 0 (and <= maximum)."""
    return _float_from_zero(False, maximum)


def non_negative_float(maximum: float = math.inf) -> Callable[[str], float]:
    """A finite number >= 0 (and <= maximum)."""
    return _float_from_zero(True, maximum)


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """``--json``: one JSON document on stdout and nothing else (``cli.main`` sends
    everything else to stderr)."""
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def fraction(raw: str) -> float:
    """A number in (0, 1]."""
    value = _number(raw)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{raw} is not in (0, 1]")
    return value
