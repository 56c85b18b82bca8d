"""What the load generator's settings choose from, and where a setting applies (its `when`:
the web UI's form hides the others, reports leave them out)."""

from __future__ import annotations

from records.declare import GIVEN

MODES = ("fixed", "stress", "mixed", "closed", "sessions", "sla")
ARRIVALS = ("poisson", "constant", "gamma")
CLIENTS = ("auto", "gevent", "aio")
AIO_MODES = ("fixed", "mixed")  # the schedules the aio sender sends
TRACE_FORMATS = ("auto", "mooncake", "burstgpt", "azure", "jsonl")
DEFAULT_CLASSES = "chat:6:64:32,summarise:2:512:32,generate:2:32:128"
# Where settings apply (their `when`): the web UI's form hides the others, reports leave them out.
OPEN_LOOP_MODES = ("fixed", "stress", "mixed", "sessions", "sla")
OPEN_LOOP = {"mode": OPEN_LOOP_MODES}
# not classes, not a dataset
ONE_SHAPE = {"mode": ("fixed", "stress", "closed", "sessions"), "dataset": ""}
STRESS = {"mode": "stress"}
SLA = {"mode": "sla"}
SESSIONS = {"mode": "sessions"}
OPENAI = {"target": "openai"}
TRITON = {"target": "triton"}
TRACED = {"trace": GIVEN}  # a trace's options: only with --trace
