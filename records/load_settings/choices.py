"""What the load generator's settings choose from, and where a setting applies (its `when`:
the web UI's form hides the others, reports leave them out)."""

from __future__ import annotations

from enum import StrEnum

from records.declare import GIVEN


class Mode(StrEnum):
    """--mode: how the requests are offered (each a class of the load generator's,
    loadgen/modes/)."""

    FIXED = "fixed"
    STRESS = "stress"
    MIXED = "mixed"
    CLOSED = "closed"
    SESSIONS = "sessions"
    SLA = "sla"

    @property
    def open_loop(self) -> bool:
        """Requests are sent on a schedule, whatever became of the earlier ones."""
        return self is not Mode.CLOSED

    @property
    def aio(self) -> bool:
        """The aio sender sends its schedule (the others run on Locust's greenlets)."""
        return self in (Mode.FIXED, Mode.MIXED, Mode.SLA)

    @property
    def rate_unit(self) -> str:
        """What --rate counts."""
        return "sessions/s" if self is Mode.SESSIONS else "requests/s"


MODES = tuple(m.value for m in Mode)
ARRIVALS = ("poisson", "constant", "gamma")
CLIENTS = ("auto", "gevent", "aio")
AIO_MODES = tuple(m.value for m in Mode if m.aio)
TRACE_FORMATS = ("auto", "mooncake", "burstgpt", "azure", "jsonl")
DEFAULT_CLASSES = "chat:6:64:32,summarise:2:512:32,generate:2:32:128"
# Where settings apply (their `when`): the web UI's form hides the others, reports leave them out.
OPEN_LOOP_MODES = tuple(m.value for m in Mode if m.open_loop)
OPEN_LOOP = {"mode": OPEN_LOOP_MODES}
# --rate's: the SLA search chooses its own rates
RATED = {"mode": tuple(m.value for m in Mode if m.open_loop and m is not Mode.SLA)}
# not classes, not a dataset
ONE_SHAPE = {"mode": (Mode.FIXED.value, Mode.STRESS.value, Mode.CLOSED.value,
                      Mode.SESSIONS.value), "dataset": ""}
STRESS = {"mode": Mode.STRESS.value}
SLA = {"mode": Mode.SLA.value}
SESSIONS = {"mode": Mode.SESSIONS.value}
OPENAI = {"target": "openai"}
TRITON = {"target": "triton"}
TRACED = {"trace": GIVEN}  # a trace's options: only with --trace
