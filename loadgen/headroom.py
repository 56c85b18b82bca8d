"""Whether one load-generator process can time the run, said before it starts: the streamed
messages a second the run asks of each process (its offered requests/s times the output
tokens each asks: a message a token at most, as servers stream) against what one process of
its client held over its target's wire (gRPC or HTTP) on a 2-core machine, server beside it,
in `make bench-loadgen` (docs/measured.md): past that, the run says how many processes to
use."""

from __future__ import annotations

import math

from loadgen.targets.target import target_class
from records.load_settings import LoadSettings
from records.load_settings.choices import AIO_MODES, Mode

# messages/s one process sent on schedule, TTFT error p50 within 5 ms (make bench-loadgen), by
# client and wire: the known-delay servers' rates (to 8,000; past 5,000 the Python gRPC one is
# the limit) and, over HTTP, the events/s sweep against the native mock (25,000 held with TTFT
# error p99 2.1 ms and nothing generator-limited; 50,000 sent, its figures limited:
# docs/measured.md)
HELD = {("gevent", "gRPC"): 2_000, ("aio", "gRPC"): 5_000,
        ("gevent", "HTTP"): 5_000, ("aio", "HTTP"): 25_000}


def wire(settings: LoadSettings) -> str:
    return "HTTP" if target_class(settings.target.target).over_http else "gRPC"


def asked_per_process(settings: LoadSettings, workers: int = 1) -> float | None:
    """Messages/s each process is asked for at the run's offered rate; None where the rate
    is not the run's to say (closed loop, a trace, stress's rising steps, the SLA search's
    probes: their own)."""
    traffic = settings.traffic
    if traffic.mode in (Mode.CLOSED, Mode.STRESS, Mode.SLA) or traffic.trace:
        return None
    turns = 1.0
    if traffic.mode == Mode.SESSIONS:  # every turn is a request: a session's turns, at most
        low, _, high = traffic.session_turns.partition("-")
        turns = float(high or low)
    return traffic.rate * turns * settings.workload.max_tokens / workers


def headroom(settings: LoadSettings, workers: int = 1) -> tuple[bool, str] | None:
    """(whether one process holds it, the line saying so); None where the rate is not known
    before the run."""
    asked = asked_per_process(settings, workers)
    if asked is None:
        return None
    client, over = settings.client, wire(settings)
    held = HELD[client, over]
    line = (f"asks up to {asked:,.0f} streamed messages/s of each generator process; one "
            f"{client} process held {held:,} over {over} on a 2-core machine "
            "(make bench-loadgen)")
    if asked <= held:
        return True, line
    more = math.ceil(asked * workers / held)
    aio = (" or --client aio" if client == "gevent" and settings.traffic.mode in AIO_MODES
           and asked <= HELD["aio", over] else "")
    return False, (f"{line}: its timestamps will lag behind the server's; use --processes "
                   f"{more} -u {more}{aio}, or lower the rate")
