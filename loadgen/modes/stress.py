"""--mode stress: the offered rate rises step by step until the server saturates,
then the run stops by itself and names the knee, the highest rate that held.

A step saturates when, over its --step-s:
- achieved throughput (ok requests completing in it) falls below --saturation-share of the
  rate actually offered (its arrivals, shifted by the median latency that separates an
  arrival from its completion) by more than the count's Poisson noise, so that noise is not
  mistaken for saturation, or
- an objective (--slo-ttft-ms, --slo-tpot-ms, --slo-e2e-ms) is not met at --slo-percentile,
  judged as every report judges it (records/slo_judgement.py), or
- the requests in flight grow steadily: the least-squares slope of in-flight samples over
  the step exceeds 10% of the offered rate and adds more than twice the in-flight count a
  healthy server holds (a queue growing without bound: loadgen/traffic/settling.py).

Latency for a step counts the requests whose first token (TTFT) or last message (TPOT, E2E)
came within it; those that failed in it and those still waiting past a TTFT or E2E limit at
its end count over: a stalled server cannot hide behind requests that have not answered yet.
A step's claim is judged met or not; early stopping's support is not asked of a step (its
percentile is a saturation signal, not a claim reported as held).
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import math
import random
import time
from collections.abc import Iterator
from pathlib import Path

import gevent

from loadgen.modes.base import RunMode, RunView, registered
from loadgen.recording import slo
from loadgen.recording.timing import stream_timing
from loadgen.targets.client import StreamResult
from loadgen.traffic.arrivals import gap_s
from loadgen.traffic.settling import growing, slope
from records.jsonform import to_json
from records.load_settings import LoadSettings
from records.load_settings.choices import Mode
from records.rundir import STEPS
from records.slo_judgement import StillWaiting, judge_objectives, value_text
from records.summary import StepRow, StressResult, Summary

GROWTH_SHARE = 0.1  # in-flight slope above this share of the offered rate counts as a growing queue
SAMPLE_S = 0.1  # in-flight sampling period


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def short_of_sent(achieved: int, sent: float, share: float) -> bool:
    """Completions fell short of the arrivals they answer: below `share` of them, and by more
    than the Poisson noise of the count (one standard deviation, sqrt(sent)), so that a step of
    a few dozen requests is not called saturated for two still in flight at its end."""
    return achieved < share * sent and sent - achieved > math.sqrt(sent)


@registered(Mode.STRESS)
class Stress(RunMode):
    one_process = ("--mode stress runs in one process (it judges each step as it ends); "
                   "drop --master/--processes")

    def __init__(self, settings: LoadSettings, workers: int = 1, index: int = 0):
        super().__init__(settings, workers, index)
        self.run: RunView | None = None  # the run it steps, from time zero
        self._watcher: gevent.Greenlet | None = None
        self.rows: list[StepRow] = []
        self.stopped_because = ""
        self._done: list = []  # (result, timing) of requests finished so far in the current step
        self._sent: list[float] = []  # send times (s from the start) of this process's arrivals
        self._lag_s = 0.0  # the last known median latency

    def rate(self, step: int) -> float:
        c = self.settings.stress
        start = c.rate_start or self.settings.traffic.rate
        return start * c.rate_mult ** step if c.rate_mult else start + c.rate_step * step

    def arrivals(self) -> Iterator[tuple[int, float]]:
        """(request index, send time s): each step's arrivals at its own rate."""
        rng = random.Random(self.settings.traffic.seed)
        index = itertools.count()
        step_s, traffic = self.settings.stress.step_s, self.settings.traffic
        for step in range(self.settings.stress.max_steps):
            start, end, rate = step * step_s, (step + 1) * step_s, self.rate(step)
            t = start
            while True:
                t += gap_s(rng, rate, traffic.arrival, traffic.burstiness)
                if t >= end:
                    break
                self._sent.append(t)
                yield next(index), t

    def begin(self, run: RunView) -> None:
        self.run = run
        self._watcher = gevent.spawn(self.watch)

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.kill()  # a web UI restart must not inherit it
        if not self.stopped_because:  # stopped from outside (-t, the web UI)
            self.stopped_because = f"stopped after {len(self.rows)} steps, before saturation"

    def summary(self, summary: Summary) -> Summary:
        return dataclasses.replace(summary, stress=self.result())

    def written(self, run_dir: Path) -> None:
        self.write_csv(run_dir)

    def observe(self, result: StreamResult) -> None:
        """Every finished request counts, warm-up included (the steps are the measurement),
        but one answered whole, which is not timed."""
        if not result.streamed:
            return
        timing = stream_timing(result.scheduled_ns, result.sent_ns, result.recv_ns, result.tokens) \
            if result.ok else None
        self._done.append((result, timing))

    def watch(self) -> None:
        """Runs beside the dispatch: samples the in-flight count, judges each step at its end,
        and stops the run at the first saturated step or after --max-steps."""
        c = self.settings.stress
        for step in range(c.max_steps):
            step_start = self.run.start_ns + int(step * c.step_s * 1e9)
            step_end = step_start + int(c.step_s * 1e9)
            samples = []
            while time.monotonic_ns() < step_end:
                samples.append(((time.monotonic_ns() - step_start) / 1e9, len(self.run.inflight)))
                gevent.sleep(SAMPLE_S)
            row = self.judge(step, step_start, step_end, samples)
            self.rows.append(row)
            if row.saturated:
                self.stopped_because = (f"step {step} at {row.offered_rps:g} requests/s: "
                                        f"{row.saturated}")
                break
        else:
            self.stopped_because = f"no saturation within {c.max_steps} steps"
        self.run.request_stop()

    def judge(self, step: int, start_ns: int, end_ns: int,
              samples: list[tuple[float, int]]) -> StepRow:
        c, objectives = self.settings.stress, self.settings.slo
        window_s = (end_ns - start_ns) / 1e9
        done, self._done = self._done, []
        ok = [(r, t) for r, t in done if t is not None and start_ns <= r.recv_ns[-1] <= end_ns]
        tokens = sum(n for r, _ in done for t_ns, n in zip(r.recv_ns, r.tokens, strict=True)
                     if start_ns <= t_ns <= end_ns)
        ttft = [t.ttft_us / 1000 for r, t in done
                if t is not None and start_ns <= r.recv_ns[0] <= end_ns]
        in_flight = list(self.run.inflight.values())
        ttft += [(r.recv_ns[0] - r.scheduled_ns) / 1e6 for r in in_flight
                 if r.recv_ns and start_ns <= r.recv_ns[0]]
        tpot = [t.tpot_us / 1000 for _, t in ok if t.tpot_us is not None]
        e2e = [t.e2e_us / 1000 for _, t in ok]
        waiting = [StillWaiting((end_ns - r.scheduled_ns) / 1e6, bool(r.recv_ns))
                   for r in in_flight]
        failed = sum(1 for _, t in done if t is None)  # ended failed within the step
        claims = judge_objectives(objectives, {"ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e},
                                  failed, waiting)
        good = sum(slo.met(objectives, t) for _, t in ok)
        offered = self.rate(step)
        # Compare completions with the arrivals one typical latency earlier, which they answer.
        self._lag_s = lag_s = percentile([t.e2e_us / 1e6 for _, t in ok], 50) or self._lag_s
        start_s = (start_ns - self.run.start_ns) / 1e9 - lag_s
        end_s = (end_ns - self.run.start_ns) / 1e9 - lag_s
        sent = sum(1 for t in self._sent if start_s <= t < end_s) / window_s
        growth = slope(samples)
        row = StepRow(step=step, offered_rps=offered, sent_rps=sent,
                      achieved_rps=len(ok) / window_s, output_tokens_per_s=tokens / window_s,
                      goodput_rps=good / window_s,
                      ttft_p50_ms=percentile(ttft, 50), ttft_p99_ms=percentile(ttft, 99),
                      tpot_p50_ms=percentile(tpot, 50), tpot_p99_ms=percentile(tpot, 99),
                      in_flight_slope_per_s=growth, saturated="")
        reasons = []
        # Requests longer than a step may not have completed yet: with none completed and none
        # older than the step, throughput tells nothing (a stall still shows as TTFT and growth).
        conclusive = ok or any((end_ns - r.scheduled_ns) / 1e9 > window_s for r in in_flight)
        if conclusive and short_of_sent(len(ok), sent * window_s, c.saturation_share):
            reasons.append(f"achieved {row.achieved_rps:.3g}/s < {c.saturation_share:g} x the "
                           f"{sent:.3g}/s sent")
        reasons += [f"{c.metric} p{c.percentile:g} {value_text(c.value_ms, 0)} > SLO "
                    f"{c.limit_ms:g} ms" for c in claims if c.requests and not c.met]
        # Growth counts when it is steep and adds more than twice the in-flight count a
        # healthy server holds (arrival rate x latency): ramp-up noise is neither.
        if conclusive and growing(samples, offered, sent * lag_s + 1, GROWTH_SHARE):
            reasons.append(f"in flight growing {growth:.3g}/s")
        return dataclasses.replace(row, saturated="; ".join(reasons))

    @property
    def knee_rps(self) -> float | None:
        """The highest offered rate whose step held."""
        held = [r.offered_rps for r in self.rows if not r.saturated]
        return max(held) if held else None

    def result(self) -> StressResult:
        warning = ""
        if self._lag_s * 2 > self.settings.stress.step_s or (self.rows and not self._lag_s):
            warning = ("requests took longer than half a step (or none completed): a step cannot "
                       "be judged before its requests finish, so the knee is unsound; use a "
                       "longer --step-s")
        return StressResult(knee_rps=self.knee_rps, stopped_because=self.stopped_because,
                            steps=list(self.rows), warning=warning)

    def write_csv(self, run_dir: Path) -> None:
        with open(run_dir / STEPS, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=[f.name for f in dataclasses.fields(StepRow)])
            writer.writeheader()
            for r in self.rows:
                writer.writerow(to_json(r))
