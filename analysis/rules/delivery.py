"""Who is late: a streamed message's delivery lag (the client's time for it minus the server's,
docs/metrics.md) in three parts, each measured where it happens:

- the load generator's own loop lag: how late a timer on the loop that timestamps the messages
  woke (loop_lag.hlog; whatever holds that loop up delays every timestamp as much);
- the server's write delay: from stamping the message to its transport accepting it
  (GetStats `write_ms`, over the run's window);
- the rest: the delivery lag's mean minus the two means: the network both ways and the
  client's gRPC or HTTP decoding.

The server's part comes as a histogram of fixed buckets; its percentiles are given as the
bucket bound they fall under (records/server_stats.py bucket_stats).
"""

from __future__ import annotations

from dataclasses import dataclass

from analysis.readers.latency import stats_ms
from analysis.readers.rundir import Run
from analysis.readers.server_stats import EMPTY, reset_between
from analysis.tables import fmt_ms
from records.server_stats import BucketStats, bucket_stats
from records.summary import Stats


@dataclass(frozen=True)
class DeliverySplit:
    delivery: Stats  # the client's delivery lag per message, ms
    loop: Stats | None  # the generator's loop lag, ms
    write: BucketStats | None  # the server's write delay, ms

    @property
    def rest_mean_ms(self) -> float:
        return (self.delivery.mean - (self.loop.mean if self.loop else 0.0)
                - (self.write.mean if self.write else 0.0))


def write_delay(run: Run) -> BucketStats | None:
    """The server's write delay over the run: end minus start snapshot (the end alone after a
    reset)."""
    server = run.summary.server
    end = server.end if server.end is not None and server.end.ok else None
    start = server.start if server.start is not None and server.start.ok else None
    if end is None:
        return None
    base = start if start and not reset_between(start, end) else EMPTY
    return bucket_stats(end.write_ms, base.write_ms)


def delivery_split(run: Run) -> DeliverySplit | None:
    """None without the client's delivery lag (a server that does not say when it emitted)."""
    delivery = stats_ms(run.histograms.get("delivery_lag"))
    if delivery is None:
        return None
    return DeliverySplit(delivery, stats_ms(run.histograms.get("loop_lag")), write_delay(run))


def lines(split: DeliverySplit) -> list[str]:
    d, loop, write = split.delivery, split.loop, split.write
    out = [f"delivery lag (server stamp -> client timestamp, per message): mean "
           f"{fmt_ms(d.mean)} ms, p50 {fmt_ms(d.p50)} ms, p99 {fmt_ms(d.p99)} ms"]
    out.append(f"- generator loop lag: mean {fmt_ms(loop.mean)} ms, p50 {fmt_ms(loop.p50)} ms, "
               f"p99 {fmt_ms(loop.p99)} ms" if loop else
               "- generator loop lag: not recorded (a run from before the probe)")
    out.append(f"- server write delay (stamp -> transport accepted it): mean "
               f"{fmt_ms(write.mean)} ms, p50 <= {write.p50:g} ms, p99 <= {write.p99:g} ms"
               if write else "- server write delay: not reported (an older server)")
    out.append(f"- the rest (network both ways, client decoding), by the means: "
               f"{fmt_ms(max(split.rest_mean_ms, 0.0))} ms")
    return out
