"""Whether one load-generator process can time the run, said before it starts: the streamed
messages a second the run asks of each process (its offered requests/s times the output
tokens each asks: a message a token at most, as servers stream) against what one process of
its client held on a 2-core machine, server beside it, in `make bench-loadgen`
(docs/measured.md): past that, the run says how many processes to use."""

from __future__ import annotations

import math

from records.load_settings import AIO_MODES, LoadSettings

# messages/s one process sent on schedule and timed within a few ms (make bench-loadgen)
HELD = {"gevent": 2_000, "aio": 5_000}


def asked_per_process(settings: LoadSettings, workers: int = 1) -> float | None:
    """Messages/s each process is asked for at the run's offered rate; None where the rate
    is not the run's to say (closed loop, a trace, stress's rising steps: their own)."""
    traffic = settings.traffic
    if traffic.mode in ("closed", "stress") or traffic.trace:
        return None
    turns = 1.0
    if traffic.mode == "sessions":  # every turn is a request: a session's turns, at most
        low, _, high = traffic.session_turns.partition("-")
        turns = float(high or low)
    return traffic.rate * turns * settings.workload.max_tokens / workers


def headroom(settings: LoadSettings, workers: int = 1) -> tuple[bool, str] | None:
    """(whether one process holds it, the line saying so); None where the rate is not known
    before the run."""
    asked = asked_per_process(settings, workers)
    if asked is None:
        return None
    client = settings.client
    held = HELD[client]
    line = (f"asks up to {asked:,.0f} streamed messages/s of each generator process; one "
            f"{client} process held {held:,} on a 2-core machine (make bench-loadgen)")
    if asked <= held:
        return True, line
    more = math.ceil(asked * workers / held)
    aio = (" or --client aio" if client == "gevent" and settings.traffic.mode in AIO_MODES
           and asked <= HELD["aio"] else "")
    return False, (f"{line}: its timestamps will lag behind the server's; use --processes "
                   f"{more} -u {more}{aio}, or lower the rate")
