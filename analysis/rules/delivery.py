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
from analysis.readers.server_metrics import figures, server_side
from analysis.readers.server_stats import EMPTY, reset_between
from analysis.rules.finding import Finding
from analysis.rules.spikes import Signals
from analysis.tables import fmt_ms
from records.load_settings.choices import Mode
from records.server_stats import BucketStats, bucket_stats
from records.summary import CPU_WAIT_PERCENT, Stats


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
    """The server's write delay over the run: end minus start GetStats snapshot (the end alone
    after a reset); without GetStats (our server over HTTP), its scraped /metrics."""
    server = run.summary.server
    end = server.end if server.end is not None and server.end.ok else None
    start = server.start if server.start is not None and server.start.ok else None
    if end is None:
        return scraped_write_delay(run)
    base = start if start and not reset_between(start, end) else EMPTY
    return bucket_stats(end.write_ms, base.write_ms)


def scraped_write_delay(run: Run) -> BucketStats | None:
    """The write delay's growth over the run's scrapes, in ms (its percentiles the bounds of
    the buckets they fall in, as GetStats' are); None where no source exposes it."""
    for series in server_side(run).engines:
        figure = figures(series).get("write_delay")
        if figure is not None and figure.window is not None and figure.window.count:
            w = figure.window
            return BucketStats(int(w.count), 1000 * w.mean, 1000 * w.p50[1], 1000 * w.p99[1])
    return None


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


# The generator's lag matters once it is a tenth of the finest latency it measures (TPOT p50, or
# TTFT p50 without one): a tenth is where a policy comparison's differences start to blur.
MATERIAL_LAG_SHARE = 0.1


def generator_limited(d: Signals) -> Finding:
    rule = ("generator_limited", "Load generator limited")
    summary = d.run.summary
    generator = summary.generator
    p50s = {metric: stats.p50 for metric in ("ttft", "tpot")
            if (stats := stats_ms(d.run.histograms.get(metric)))}
    finest = min(p50s.values(), default=None)
    evidence, reasons, lags = _lag_evidence(d, finest)
    evidence.append(f"generator CPU {generator.cpu_percent:.0f}% of a core")
    if (waited := generator.cpu_wait_percent) is not None:
        evidence.append(f"it waited for a core {waited:.1f}% of the run (runnable, while "
                        "other processes held the cores)")
        if waited > CPU_WAIT_PERCENT:
            reasons.append(f"it waited for a core {waited:.0f}% of the run")
    warnings = generator.warnings
    evidence += [f"warning: {w}" for w in warnings]
    closed = (not Mode(summary.config.traffic.mode).open_loop
              or any(w.startswith("closed loop:") for w in warnings))
    if lags:
        name, worst = max(lags.items(), key=lambda item: item[1])
        scale = [f"{worst / p50:.1%} of the {metric.upper()} p50 ({fmt_ms(p50)} ms)"
                 for metric, p50 in p50s.items()]
        larger = "larger " if len(lags) > 1 else ""
        evidence += [f"the {larger}lag p99 ({name}, {fmt_ms(worst)} ms) is "
                     + " and ".join(scale)] if scale else []
        # late by the generator's own standard (its late-send threshold) and by enough to matter
        if finest and worst > max(MATERIAL_LAG_SHARE * finest, d.late_ms) and not reasons:
            reasons.append(f"its {name} p99 ({fmt_ms(worst)} ms) is over {MATERIAL_LAG_SHARE:.0%} "
                           f"of the finest latency measured ({fmt_ms(finest)} ms p50) and over "
                           f"{d.late_ms:g} ms")
    size = f" (lag p99 up to {fmt_ms(max(lags.values()))} ms)" if lags else ""
    late = (f"load generator's own lateness{size} makes the latency figures suspect: "
            + " and ".join(reasons))
    if closed:  # no schedule to keep: the loop itself is the generator's limit
        return Finding(*rule, True, "The closed loop (--mode closed) under-states latency under "
                       "load: each user waited for its previous response before sending, so a "
                       "slow server was sent fewer requests and its queueing is missing from the "
                       "figures (coordinated omission); use --mode fixed to measure latency at a "
                       "given offered load." + (f" Also, the {late}." if reasons else ""), evidence)
    if not reasons:
        warned = (f"; it warned {len(warnings)} time(s), but its lags are small beside the "
                  "latencies measured" if warnings else " and raised no warnings")
        return Finding(*rule, False, f"The load generator kept its schedule{warned}.", evidence)
    return Finding(*rule, True, f"The {late}; see its warnings.", evidence)


def _lag_evidence(d: Signals, finest: float | None
                  ) -> tuple[list[str], list[str], dict[str, float]]:
    """The generator's send, loop and delivery lags: what they show, the reason a late send
    accuses the generator (beside the finest latency p50 measured), and each lag's p99."""
    summary = d.run.summary
    send = stats_ms(d.run.histograms.get("send_lag"))
    if send is None and summary.metrics.get("send_lag_ms") and summary.metrics["send_lag_ms"].count:
        send = summary.metrics["send_lag_ms"]
    evidence, reasons, lags = [], [], {}
    if send:
        lags["send lag"] = send.p99
        evidence.append(f"send lag p99 {fmt_ms(send.p99)} ms, max {fmt_ms(send.max)} ms (threshold "
                        f"{d.late_ms:g} ms); {summary.generator.late_sends} late sends")
        # late, and by enough to matter: one send 5 ms late beside a 300 ms TTFT accuses no one
        if send.p99 > d.late_ms and not (finest and send.p99 <= MATERIAL_LAG_SHARE * finest):
            reasons.append(f"it sent requests late (send lag p99 {fmt_ms(send.p99)} ms > "
                           f"{d.late_ms:g} ms), which counts as latency the server did not cause")
    if loop := stats_ms(d.run.histograms.get("loop_lag")):
        lags["loop lag"] = loop.p99
        evidence.append(f"loop lag p99 {fmt_ms(loop.p99)} ms (how late the generator's own "
                        "event loop woke: its timestamps are as late)")
    if delivery := stats_ms(d.run.histograms.get("delivery_lag")):
        evidence.append(f"delivery lag p99 {fmt_ms(delivery.p99)} ms (server stamp -> "
                        "timestamped here; its parts: see the server write delay rule)")
    return evidence, reasons, lags


def server_write_delay(d: Signals) -> Finding:
    """The server's own part of the delivery lag: stamped -> its transport accepted the
    message (delivery_split above), judged against the latencies measured."""
    rule = ("server_write_delay", "Server write delay")
    split = delivery_split(d.run)
    if split is None or split.write is None:
        return Finding(*rule, False, "No server write delay over the run (an older server, or "
                       "a target that does not report one).", [], judged=False)
    evidence = lines(split)
    end = d.run.summary.server.latest
    busy = (d.series.step_ms.sum() / 1000 / d.series.length_s.sum()
            if d.series is not None and d.series.length_s.sum() > 0 else None)
    if end is not None:  # from GetStats; over HTTP the write delay was scraped
        evidence.append(f"server process CPU {end.process_cpu_percent:.0f}% of a core"
                        + (f", engine steps {busy:.0%} of the time" if busy is not None else ""))
    write, delivery = split.write, split.delivery
    p50s = [s.p50 for m in ("ttft", "tpot") if (s := stats_ms(d.run.histograms.get(m)))]
    finest = min(p50s, default=None)
    material = finest is not None and write.p99 > MATERIAL_LAG_SHARE * finest
    dominant = delivery.mean > 0 and write.mean > 0.5 * delivery.mean
    if not (material and dominant):
        return Finding(*rule, False, f"The server's writes took a mean {fmt_ms(write.mean)} ms "
                       f"(p99 <= {write.p99:g} ms) of a {fmt_ms(delivery.mean)} ms mean delivery "
                       "lag" + ("" if material else ", small beside the latencies measured")
                       + ".", evidence)
    return Finding(*rule, True, f"The server's own writes are most of the delivery lag: stamped "
                   f"-> accepted by its transport in a mean {fmt_ms(write.mean)} ms of "
                   f"{fmt_ms(delivery.mean)} ms, p99 <= {write.p99:g} ms (over "
                   f"{MATERIAL_LAG_SHARE:.0%} of the finest latency, {fmt_ms(finest)} ms p50). "
                   "The likely cause is the engine sharing the server's process with the event "
                   "loop that writes: its thread's Python holds the interpreter lock and its "
                   "compute the cores the loop and gRPC's threads need; fewer torch threads, or "
                   "a machine with cores to spare, shorten it.", evidence)
