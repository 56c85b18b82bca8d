"""argparse types for the commands' numeric flags: argparse names the flag in its error."""

from __future__ import annotations

import argparse
import math


def number(kind: type, low: float, *, strict: bool = True, high: float | None = None,
           high_strict: bool = False):
    """A number above `low` (at least `low` when not strict) and, with `high`, at most `high`
    (below it when high_strict)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            expected = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        above = value > low if strict else value >= low
        below = high is None or (value < high if high_strict else value <= high)
        if not (above and below and math.isfinite(value)):
            bounds = f"{'above' if strict else 'at least'} {low:g}"
            if high is not None:
                bounds += f" and {'below' if high_strict else 'at most'} {high:g}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {text}")
        return value

    return parse


def numbers(low_ok: bool):
    """Comma-separated numbers, each above 0 (at least 0 when low_ok)."""

    def parse(text: str) -> list[float]:
        try:
            values = [float(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, "
                                             f"got {text!r}") from None
        if (not all(v >= 0 if low_ok else v > 0 for v in values)
                or not all(math.isfinite(v) for v in values)):
            least = "at least" if low_ok else "above"
            raise argparse.ArgumentTypeError(f"every value must be {least} 0, got {text}")
        return values

    return parse
