"""Accounting and latency recording for one run, and the numbers of its summary.

Every request the schedule produced ends in exactly one bucket: not sent (the generator's
own in-flight limit, or due just as the run stopped), ok, or failed by status code.
Requests scheduled during warm-up are counted but kept out of the latency histograms;
throughput counts what completed inside the measured window, whenever it was scheduled.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from loadgen.recording import slo as objectives
from loadgen.recording.groups import Groups
from loadgen.recording.histograms import Binned, Histogram
from loadgen.recording.limits import GeneratorLimits
from loadgen.recording.timing import StreamTiming, stream_timing
from loadgen.targets.client import StreamResult
from records.jsonform import from_json, to_json
from records.load_settings import LoadSettings, SloSettings
from records.requests import CLIENT_CANCELLED, RequestRow
from records.summary import (
    Accounting,
    ClassFigures,
    Reasoning,
    SessionEnd,
    SessionFigures,
    SloShares,
    Throughput,
)


def reasoning_split(r: StreamResult) -> dict:
    """A stream's tokens of each kind, and when the first of each came (ns; None: none)."""
    kinds = list(zip(r.recv_ns, r.tokens, r.reasoning, strict=True))
    return {"reasoning_tokens": sum(n for _, n, thinking in kinds if thinking),
            "answer_tokens": sum(n for _, n, thinking in kinds if not thinking),
            "ttfr_ns": next((t for t, _, thinking in kinds if thinking), None),
            "ttfa_ns": next((t for t, _, thinking in kinds if not thinking), None)}


CLIENT_METRICS = ("ttft", "ttft_service", "tpot", "itl", "itl_token", "e2e", "e2e_service",
                  "send_lag", "delivery_lag", "loop_lag")
SERVER_METRICS = ("queue", "prefill", "decode", "ttft")
LATE_SEND_MS = 5.0  # a send this late means the generator, not the server, is the bottleneck
MERGED_COUNTS = ("not_sent", "after_stop", "late_sends", "warmup", "window_tokens", "window_ok",
                 "window_good", "slo_judged", "rows_omitted", "off_length", "unstreamed",
                 "kernel_timed")


@dataclass
class Recorder:
    """Requests are folded in as they finish and only a row each is kept, so memory grows
    with requests, not with tokens, however long the run."""

    start_ns: int
    warmup_s: float
    slo: SloSettings = field(default_factory=SloSettings)
    stop_ns: int | None = None  # end of the schedule, set when the run stops
    start_unix_s: float | None = None  # start_ns on the wall clock (Unix s), set with it
    client: dict[str, Histogram] = field(
        default_factory=lambda: {m: Histogram() for m in CLIENT_METRICS})
    interval: dict[str, Histogram] = field(
        default_factory=lambda: {m: Histogram() for m in CLIENT_METRICS})
    spare: dict[str, Histogram] = field(  # the interval taken last (take_interval)
        default_factory=lambda: {m: Histogram() for m in CLIENT_METRICS})
    server: dict[str, Histogram] = field(
        default_factory=lambda: {m: Histogram() for m in SERVER_METRICS})
    classes: Groups = field(default_factory=Groups)  # by request class
    turns: Groups = field(default_factory=Groups)  # by turn of a session (sessions mode)
    # sessions: how they ended, turns asked and ok, and the durations of the completed ones
    session_ends: Counter = field(default_factory=Counter)
    session_turns: Counter = field(default_factory=Counter)
    session_duration: Histogram = field(default_factory=Histogram)
    rows: list[RequestRow] = field(default_factory=list)  # one per request sent, up to max_rows
    max_rows: int = 100_000  # requests.jsonl cap: memory stays bounded in a soak
    rows_omitted: int = 0
    statuses: Counter = field(default_factory=Counter)
    not_sent: int = 0
    # sent though due after the stop: a sender that heard of the stop late (a distributed
    # worker's, a stop from the web UI); outside the run, counted apart and nowhere else
    after_stop: int = 0
    late_sends: int = 0
    warmup: int = 0
    window_tokens: int = 0  # output tokens received inside the measured window
    window_ok: int = 0  # ok requests that completed inside it (whenever scheduled)
    window_good: int = 0  # ... and met the SLOs
    # measured ok requests meeting each objective, and all
    slo_met: Counter = field(default_factory=Counter)
    slo_judged: int = 0  # measured ok requests
    off_length: int = 0  # ok requests whose server counted another output length than asked
    unstreamed: int = 0  # ok requests answered whole (--routed-experts-sample): not timed
    # ok streamed requests whose messages the kernel's receipt timed (docs/metrics.md,
    # "Arrival times"), not the generator's reads
    kernel_timed: int = 0
    # measured ok requests that reasoned: tokens of each kind, requests with no answer, and
    # the times to the first token of each kind
    reasoned: Counter = field(default_factory=Counter)
    reasoning_times: dict[str, Histogram] = field(
        default_factory=lambda: {"ttfr": Histogram(), "ttfa": Histogram()})
    # where the generator was the limit
    limits: GeneratorLimits = field(default_factory=GeneratorLimits)

    @classmethod
    def for_settings(cls, settings: LoadSettings, start_ns: int) -> Recorder:
        """The recorder a run with these settings keeps: its warm-up, SLOs and row cap."""
        return cls(start_ns, settings.recording.warmup_s, settings.slo,
                   max_rows=settings.recording.max_request_rows)

    @property
    def warmup_end_ns(self) -> int:
        return self.start_ns + int(self.warmup_s * 1e9)

    def in_window(self, t_ns: int) -> bool:
        return self.warmup_end_ns <= t_ns and (self.stop_ns is None or t_ns <= self.stop_ns)

    def add(self, result: StreamResult) -> StreamTiming | None:
        """Accounts for a finished request; returns its timing when it is measured and ok."""
        if self.stop_ns is not None and result.scheduled_ns > self.stop_ns:
            self.after_stop += 1
            return None
        self.statuses[result.status] += 1
        done = result.usage.get("completion_tokens")
        self.off_length += bool(result.ok and result.max_tokens and done is not None
                                and done != result.max_tokens)
        if result.request_class:
            self.classes.count(result.request_class, result.status)
        if result.turn:
            self.turns.count(str(result.turn), result.status)
        lag_us = (result.sent_ns - result.scheduled_ns) // 1000 if result.sent_ns else None
        if lag_us is not None and lag_us > LATE_SEND_MS * 1000:
            self.late_sends += 1
        self.window_tokens += sum(n for t, n in zip(result.recv_ns, result.tokens, strict=True)
                                  if self.in_window(t))
        timing = stream_timing(result.scheduled_ns, result.sent_ns, result.recv_ns, result.tokens,
                               result.server_elapsed_us) if result.ok and result.streamed else None
        checks = objectives.checks(self.slo, timing) if timing else {}
        whole = result.ok and not result.streamed
        self.unstreamed += whole
        self.kernel_timed += result.ok and result.streamed and result.kernel_timed
        if (timing or whole) and self.in_window(result.recv_ns[-1]):
            self.window_ok += 1
            self.window_good += bool(timing) and all(checks.values())
        warmup = result.scheduled_ns < self.warmup_end_ns
        self.warmup += warmup
        if len(self.rows) < self.max_rows:
            self.rows.append(self.row(result, timing, warmup))
        else:
            self.rows_omitted += 1
        if warmup:
            return None
        if lag_us is not None:
            self.record("send_lag", lag_us)
            self.limits.send(self.second(result.sent_ns), lag_us)
        if timing is None:
            return None
        self.record_timing(result, timing, checks)
        return timing

    def record_timing(self, result: StreamResult, timing: StreamTiming,
                      checks: dict[str, bool]) -> None:
        """A measured ok request's latencies into the histograms, its SLO checks into the
        shares, and its class's, turn's and server's figures."""
        self.slo_judged += 1
        self.slo_met.update([name for name, ok in checks.items() if ok]
                            + (["all"] if all(checks.values()) else []))
        for name in ("ttft", "ttft_service", "e2e", "e2e_service"):
            self.record(name, getattr(timing, f"{name}_us"))
        self.record_all("itl", timing.itl_us)
        self.limits.gaps(self.second(result.recv_ns[-1]), timing.itl_us)
        self.record_all("itl_token", timing.itl_token_us)
        # the sub-microsecond rounding below zero is 0, not a clamped value
        self.record_all("delivery_lag", [max(lag, 0) for lag in timing.delivery_lag_us])
        if timing.tpot_us is not None:
            self.record("tpot", timing.tpot_us)
        if any(result.reasoning):
            self.add_reasoning(result)
        if result.request_class:
            self.classes.record(result.request_class, timing)
        if result.turn:
            self.turns.record(str(result.turn), timing)
        for name in SERVER_METRICS:
            if f"{name}_us" in result.usage:
                self.server[name].record(result.usage[f"{name}_us"])

    def add_reasoning(self, r: StreamResult) -> None:
        split = reasoning_split(r)
        self.reasoned.update(requests=1, reasoning_tokens=split["reasoning_tokens"],
                             answer_tokens=split["answer_tokens"],
                             no_answer=split["ttfa_ns"] is None)
        self.reasoning_times["ttfr"].record((split["ttfr_ns"] - r.scheduled_ns) // 1000)
        if split["ttfa_ns"] is not None:
            self.reasoning_times["ttfa"].record((split["ttfa_ns"] - r.scheduled_ns) // 1000)

    def reasoning(self) -> Reasoning | None:
        if not self.reasoned["requests"]:
            return None
        return Reasoning(requests=self.reasoned["requests"],
                         reasoning_tokens=self.reasoned["reasoning_tokens"],
                         answer_tokens=self.reasoned["answer_tokens"],
                         ttfr_ms=self.reasoning_times["ttfr"].stats(),
                         ttfa_ms=self.reasoning_times["ttfa"].stats(),
                         no_answer=self.reasoned["no_answer"])

    def export(self) -> dict:
        """Everything a merge needs, as plain types (Locust sends it between processes)."""
        return {
            "client": {name: [h.encode(), h.clamped] for name, h in self.client.items()},
            "server": {name: [h.encode(), h.clamped] for name, h in self.server.items()},
            "statuses": dict(self.statuses), "slo_met": dict(self.slo_met),
            "rows": to_json(self.rows),
            "classes": self.classes.export(), "turns": self.turns.export(),
            "session_ends": dict(self.session_ends), "session_turns": dict(self.session_turns),
            "session_duration": [self.session_duration.encode(), self.session_duration.clamped],
            "limits": self.limits.export(), **{k: getattr(self, k) for k in MERGED_COUNTS},
        }

    def absorb(self, part: dict) -> None:
        """Adds another recorder's export: histograms exactly (HDR add), counts summed."""
        for kind, hists in (("client", self.client), ("server", self.server)):
            for name, (encoded, clamped) in part[kind].items():
                hists[name].merge(encoded, clamped)
        self.statuses.update(part["statuses"])
        self.classes.absorb(part["classes"])
        self.turns.absorb(part["turns"])
        self.session_ends.update(part["session_ends"])
        self.session_turns.update(part["session_turns"])
        self.session_duration.merge(*part["session_duration"])
        self.slo_met.update(part["slo_met"])
        self.limits.absorb(part["limits"])
        room = self.max_rows - len(self.rows)
        self.rows.extend(from_json(RequestRow, row, "a worker's row")
                         for row in part["rows"][:room])
        self.rows_omitted += max(0, len(part["rows"]) - room)
        for k in MERGED_COUNTS:
            setattr(self, k, getattr(self, k) + part[k])

    def loop_lag(self, t_ns: int, late_us: int) -> None:
        """One wake of the event-loop probe (loadgen/recording/loop_lag.py), in the window."""
        if self.in_window(t_ns):
            self.record("loop_lag", late_us)
            self.limits.wake(self.second(t_ns), late_us)

    def second(self, t_ns: int) -> int:
        """The second of the run t_ns falls in."""
        return (t_ns - self.start_ns) // 1_000_000_000

    def record(self, metric: str, value_us: float) -> None:
        """Into the run's histogram and the current interval's."""
        self.client[metric].record(value_us)
        self.interval[metric].record(value_us)

    def record_all(self, metric: str, values_us: list[float]) -> None:
        """record() of each of a stream's values."""
        if values_us:
            binned = Binned.of(values_us)
            self.client[metric].add(binned)
            self.interval[metric].add(binned)

    def take_interval(self) -> dict[str, Histogram]:
        """The interval histograms so far, valid until the next take; recording goes on into
        the ones taken the time before, emptied (Histogram.clear: not new ones each time)."""
        taken, self.interval = self.interval, self.spare
        for h in self.interval.values():
            h.clear()
        self.spare = taken
        return taken

    def class_figures(self) -> dict[str, ClassFigures]:
        """Each request class on its own: counts, and latency of its measured ok requests."""
        return self.classes.figures()

    def end_session(self, outcome: SessionEnd, turns_asked: int, turns_ok: int,
                    duration_us: int | None) -> None:
        """A session is over, as outcome says; duration_us from its first turn's
        scheduled send to its last reply's end, for a completed session."""
        self.session_ends[outcome] += 1
        self.session_turns.update(asked=turns_asked, ok=turns_ok)
        if duration_us is not None:
            self.session_duration.record(duration_us)

    def sessions(self) -> SessionFigures | None:
        started = sum(self.session_ends.values())
        if not started:
            return None
        ends = {k.value: self.session_ends[k] for k in SessionEnd}
        return SessionFigures(started=started, **ends,
                              turns_asked=self.session_turns["asked"] / started,
                              turns_ok=self.session_turns["ok"] / started,
                              duration_ms=self.session_duration.stats(),
                              by_turn=self.turns.figures(order=int))

    def row(self, r: StreamResult, t: StreamTiming | None, warmup: bool) -> RequestRow:
        """The request's line in requests.jsonl, times in ms from the run's start."""
        return RequestRow(
            request_id=r.request_id, request_class=r.request_class, status=r.status,
            details=r.details,
            warmup=warmup, scheduled_ms=(r.scheduled_ns - self.start_ns) / 1e6,
            sent_ms=(r.sent_ns - self.start_ns) / 1e6 if r.sent_ns else None,
            sent_unix_s=self.start_unix_s + (r.sent_ns - self.start_ns) / 1e9
            if r.sent_ns and self.start_unix_s is not None else None,
            output_tokens=sum(r.tokens), messages=len(r.tokens),
            ttft_ms=t.ttft_us / 1000 if t else None,
            tpot_ms=t.tpot_us / 1000 if t and t.tpot_us is not None else None,
            e2e_ms=t.e2e_us / 1000 if t else None, streamed=r.streamed,
            session=r.session, turn=r.turn,
            **{f"server_{k}": v for k, v in r.usage.items()}, **self._reasoning_fields(r))

    def _reasoning_fields(self, r: StreamResult) -> dict:
        if not any(r.reasoning):
            return {}
        split = reasoning_split(r)
        return {"reasoning_tokens": split["reasoning_tokens"],
                "answer_tokens": split["answer_tokens"],
                "ttfr_ms": (split["ttfr_ns"] - r.scheduled_ns) / 1e6,
                "ttfa_ms": (split["ttfa_ns"] - r.scheduled_ns) / 1e6
                if split["ttfa_ns"] is not None else None}

    def slo_shares(self) -> SloShares:
        """The objectives and the share of measured ok requests meeting each, and all."""
        given = objectives.objectives_ms(self.slo)
        share = {n: self.slo_met[n] / self.slo_judged if self.slo_judged else None
                 for n in [*given, "all"]}
        return SloShares(objectives_ms=given, requests=self.slo_judged, met_share=share)

    def accounting(self) -> Accounting:
        failed = {code: n for code, n in sorted(self.statuses.items())
                  if code not in ("OK", CLIENT_CANCELLED)}
        return Accounting(sent=sum(self.statuses.values()), ok=self.statuses["OK"],
                          failed=sum(failed.values()), not_sent=self.not_sent,
                          failed_by_code=failed, warmup=self.warmup,
                          rows_omitted=self.rows_omitted,
                          cancelled=self.statuses[CLIENT_CANCELLED], unstreamed=self.unstreamed)

    @property
    def kernel_timed_share(self) -> float:
        """Of the ok streamed requests, the share whose messages the kernel's receipt timed."""
        streamed = self.statuses["OK"] - self.unstreamed
        return self.kernel_timed / streamed if streamed else 0.0

    @property
    def window_s(self) -> float:
        """The measured window: end of warm-up to the end of the schedule."""
        return max(self.stop_ns - self.warmup_end_ns, 1) / 1e9

    def throughput(self, window_s: float) -> Throughput:
        """Rates over the measured window: output tokens received in it, and ok requests
        (meeting the SLOs, for goodput) that completed in it."""
        return Throughput(window_s=window_s, output_tokens_per_s=self.window_tokens / window_s,
                          requests_per_s=self.window_ok / window_s,
                          goodput_requests_per_s=self.window_good / window_s)
