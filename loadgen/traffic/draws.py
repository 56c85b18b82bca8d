"""A number a workload draws per item, seeded by the item: a constant (`4`), uniform between
two values (`2-6`: whole numbers for counts, any value for seconds), or exponential with a
mean (`exp:2.5`, seconds only). --session-turns and --think-time-s take them."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Draw:
    kind: str  # "constant", "uniform" or "exp"
    low: float
    high: float = 0.0
    whole: bool = False  # a count: whole numbers only

    @classmethod
    def parse(cls, spec: str, whole: bool = False) -> Draw:
        """'N', 'MIN-MAX' or (seconds) 'exp:MEAN'; raises ValueError saying which forms."""
        forms = "N or MIN-MAX" + ("" if whole else " or exp:MEAN")
        kind, _, mean = spec.strip().partition(":")
        low, _, high = spec.strip().partition("-")
        try:
            if mean and kind == "exp" and not whole:
                draw = cls("exp", float(mean))
            elif high:
                draw = cls("uniform", float(low), float(high), whole)
            else:
                draw = cls("constant", float(spec), whole=whole)
        except ValueError:
            raise ValueError(f"{spec!r} is not {forms}") from None
        if whole and not all(float(v).is_integer() for v in (draw.low, draw.high)):
            raise ValueError(f"{spec!r}: a count is a whole number ({forms})")
        least = 1 if whole else 0
        if draw.low < least or (draw.kind == "uniform" and draw.high < draw.low):
            raise ValueError(f"{spec!r}: values at least {least}" +
                             (", MIN up to MAX" if draw.kind == "uniform" else ""))
        if draw.kind == "exp" and draw.low <= 0:
            raise ValueError(f"{spec!r}: the mean must be above 0")
        return draw

    def __call__(self, rng: random.Random) -> float:
        if self.kind == "constant":
            return int(self.low) if self.whole else self.low
        if self.kind == "exp":
            return rng.expovariate(1 / self.low)
        if self.whole:
            return rng.randint(int(self.low), int(self.high))
        return rng.uniform(self.low, self.high)

    @property
    def most(self) -> float:
        """The largest value it draws (inf for exp)."""
        return {"constant": self.low, "uniform": self.high}.get(self.kind, float("inf"))
