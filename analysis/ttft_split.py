"""Where each request's TTFT went, from its requests.jsonl row: the generator's own lateness
(scheduled -> sent), the server's queue and prefill (its usage summary), the rest of the
server's time to the first token, and the network and client (the service TTFT, sent ->
first token, minus the server's TTFT; two durations, so the hosts' clocks need not agree).

Split by TTFT band (all requests, the slowest 10%, the slowest 1%), to show what makes the
slow ones slow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.readers.rows import column, measured_ok
from records.requests import RequestRow

PARTS = ("generator lag", "server queue", "server prefill", "server other", "network + client")
BANDS = {"all": 0.0, "slowest 10%": 90.0, "slowest 1%": 99.0}


@dataclass(frozen=True)
class TtftSplit:
    requests: int  # measured ok requests with the server's usage summary
    bands: dict[str, tuple[int, np.ndarray]]  # band -> (requests, mean ms of each PART)


def ttft_split(rows: list[RequestRow]) -> TtftSplit | None:
    """None when no measured request carries the server's times."""
    rows = [row for row in measured_ok(rows)
            if row.server_ttft_us is not None and row.sent_ms is not None]
    if not rows:
        return None
    ttft = column(rows, "ttft_ms")
    lag = column(rows, "sent_ms") - column(rows, "scheduled_ms")
    queue = column(rows, "server_queue_us") / 1000
    prefill = column(rows, "server_prefill_us") / 1000
    server_ttft = column(rows, "server_ttft_us") / 1000
    parts = np.stack([lag, queue, prefill, server_ttft - queue - prefill, ttft - lag - server_ttft],
                     axis=1)  # [R, 5]
    slowest_first = np.argsort(-ttft, kind="stable")
    bands = {}
    for name, percentile in BANDS.items():
        # The slowest ceil(n x (100 - p) / 100) requests, at least one.
        chosen = slowest_first[: max(1, math.ceil(len(rows) * (100 - percentile) / 100))]
        bands[name] = (len(chosen), np.nanmean(parts[chosen], axis=0))
    return TtftSplit(len(rows), bands)
