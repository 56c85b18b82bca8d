"""summary.json (schema 1), written by the load generator at the end of a run and read by the
analysis: the configuration, the latency statistics from the HDR histograms, throughput and
goodput, SLO shares, the accounting of every request, the generator's own health, per-class
figures, the server's GetStats at the start and end, and the stress steps or the workers
where they apply. docs/run-directory.md describes each field.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from records.early_stopping import Judged, Verdict
from records.jsonform import field
from records.load_settings import LoadSettings
from records.server_stats import ServerStats

SCHEMA = 1


@dataclass(frozen=True, kw_only=True)
class Stats:
    """One latency metric in ms, from its HDR histogram: the count alone when it has none."""

    count: int
    mean: float | None = field(None, omit=None)
    p50: float | None = field(None, omit=None)
    p90: float | None = field(None, omit=None)
    p95: float | None = field(None, omit=None)
    p99: float | None = field(None, omit=None)
    p999: float | None = field(None, omit=None)
    max: float | None = field(None, omit=None)
    clamped: int = field(0, omit=0)  # values outside the histogram's range, clamped into it


@dataclass(frozen=True, kw_only=True)
class Lengths:
    """A length's distribution over the requests sent, in tokens."""

    mean: float
    p50: int
    p90: int
    p99: int
    max: int


@dataclass(frozen=True, kw_only=True)
class OfferedWorkload:
    """What the requests sent asked for: their prompt lengths, the output lengths asked, and
    the share of their prompt tokens in 16-token blocks an earlier prompt of the run began
    with (records/prefix_blocks.py): what a prefix cache of 262,144 tokens could hit."""

    requests: int
    prompt_tokens: Lengths
    max_tokens: Lengths
    prefix_share: float


@dataclass(frozen=True, kw_only=True)
class Reasoning:
    """A thinking model's streams (the openai target's reasoning deltas), over the measured
    ok requests that reasoned: their tokens of each kind, when each kind began (from the
    scheduled send, as TTFT, which stays the first token of either kind), and how many spent
    every token asked on reasoning, with no answer."""

    requests: int
    reasoning_tokens: int
    answer_tokens: int
    ttfr_ms: Stats  # time to the first reasoning token
    ttfa_ms: Stats  # time to the first answer token (requests with one)
    no_answer: int


@dataclass(frozen=True, kw_only=True)
class Throughput:
    """Over the measured window (end of warm-up -> end of the schedule)."""

    window_s: float
    output_tokens_per_s: float  # tokens received in the window
    requests_per_s: float  # ok requests whose last message landed in it
    goodput_requests_per_s: float  # ... and met every SLO


@dataclass(frozen=True, kw_only=True)
class SloShares:
    objectives_ms: dict[str, float]  # ttft, tpot, e2e: the objectives given
    requests: int  # measured ok requests judged
    met_share: dict[str, float | None]  # each objective and "all"; None with no request judged


@dataclass(frozen=True, kw_only=True)
class Accounting:
    """Every request the schedule produced, in exactly one place: sent = ok + failed +
    cancelled."""

    sent: int
    ok: int
    failed: int
    not_sent: int  # over --max-in-flight, or due as the run stopped
    failed_by_code: dict[str, int]
    warmup: int  # scheduled during the warm-up: sent and counted, not measured
    rows_omitted: int = 0  # past --max-request-rows, so not in requests.jsonl
    cancelled: int = field(0, omit=0)  # by the client on purpose (--cancel-share)
    # ok, answered whole, not streamed, for their routed experts (--routed-experts-sample):
    # counted here and in throughput, not in the latency figures or goodput
    unstreamed: int = field(0, omit=0)


# the generator waiting for a core past this share of its run: its sends and timestamps were held
# up by other processes, in stretches of up to hundreds of ms (a healthy run beside a spinning
# vLLM CPU server in the same login session waits 2-3%, one from another session 30-50%)
CPU_WAIT_PERCENT = 10.0


@dataclass(frozen=True, kw_only=True)
class Generator:
    """The load generator's own health."""

    late_sends: int  # sent more than late_threshold_ms after their scheduled time
    late_threshold_ms: float
    cpu_percent: float  # of one core, over the run and its drain
    warnings: list[str]  # what may make the figures wrong, and what to do
    # of the run and its drain: runnable but waiting for a core (Linux's run-queue time); None
    # where unknown, and in runs recorded before it was kept
    cpu_wait_percent: float | None = field(None, omit=None)
    # who sent and timed the streams (--client, auto resolved): aio or gevent; "" in runs
    # recorded before it was kept
    client: str = field("", omit="")
    # what the figures rest on, for a reader to know (how tokens were counted, what a trace
    # held); runs from before it kept these among the warnings
    notes: list[str] = field(default_factory=list, omit=[])
    # figure ("ttft", "itl") -> from when and why the generator, not the server, limited it
    # (loadgen/recording/limits.py); its warnings say so too
    limited: dict[str, str] = field(default_factory=dict, omit={})


@dataclass(frozen=True, kw_only=True)
class ClassFigures:
    """One request class (mixed mode, a dataset)."""

    sent: int
    ok: int
    ttft_ms: Stats
    tpot_ms: Stats
    e2e_ms: Stats


class SessionEnd(StrEnum):
    """How a session ended: SessionFigures counts each."""

    COMPLETED = "completed"  # every turn ok
    FAILED = "failed"  # at a turn that failed
    CANCELLED = "cancelled"  # at a turn the client cancelled
    STOPPED = "stopped"  # the run ended before its last turn


@dataclass(frozen=True, kw_only=True)
class SessionFigures:
    """Multi-turn sessions (--mode sessions): how they ended, their turns, how long the
    completed ones took (first turn's scheduled send to the last reply's end, think times
    included), and each turn's requests (turn 1 against later turns is where a server's
    prefix cache shows). Every turn is a request in the accounting too."""

    started: int
    completed: int  # every turn ok
    failed: int  # ended at a turn that failed
    cancelled: int  # ended at a turn the client cancelled (--cancel-share)
    stopped: int  # the run ended before their last turn
    turns_asked: float  # a session's turns, mean
    turns_ok: float  # ... of them ok, mean
    duration_ms: Stats
    by_turn: dict[str, ClassFigures]  # "1", "2", ...


@dataclass(frozen=True, kw_only=True)
class ServerSnapshots:
    start: ServerStats | None = field(None, omit=None)
    end: ServerStats | None = field(None, omit=None)

    @property
    def latest(self) -> ServerStats | None:
        """The end snapshot, or the start one without it; None without either (or with errors
        only)."""
        return next((s for s in (self.end, self.start) if s is not None and s.ok), None)


@dataclass(frozen=True, kw_only=True)
class StepRow:
    """One stress step (also a row of steps.csv)."""

    step: int
    offered_rps: float  # the step's nominal rate
    # arrivals actually scheduled in the step, one median latency earlier (a Poisson sample)
    sent_rps: float
    achieved_rps: float
    output_tokens_per_s: float
    goodput_rps: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    in_flight_slope_per_s: float
    saturated: str  # why, or "" when the step held


@dataclass(frozen=True, kw_only=True)
class StressResult:
    knee_rps: float | None  # the highest offered rate whose step held
    stopped_because: str
    steps: list[StepRow]
    warning: str = field("", omit="")


class ProbeVerdict(StrEnum):
    """An SLA probe's verdict (loadgen/sla/watch.py)."""

    PASS = "PASS"  # every claim met and supported, in flight settled
    FAIL = "FAIL"  # a claim not met, or in flight still growing at its longest
    NOT_VALID = "NOT VALID"  # every claim met, too few requests to support them: not a fail
    SET_ASIDE = "SET ASIDE"  # the load generator fell behind: not judged


@dataclass(frozen=True, kw_only=True)
class SlaProbe:
    """One rate the SLA search tried (loadgen/sla/search.py)."""

    rate_rps: float
    # from the first probe's start (one process: the schedule's time zero); its first
    # --sla-warmup-s not judged
    started_s: float
    judged_s: float  # how long it was judged before its verdict
    failed: int  # requests that failed (each counted over every limit)
    claims: list[Judged]  # one per objective
    verdict: str  # ProbeVerdict
    why: str = field("", omit="")  # the verdict in words
    # requests in flight added over the last half of its judged time, where that says the
    # queue had not settled (loadgen/traffic/settling.py); 0 settled
    growth: float = field(0.0, omit=0.0)
    send_lag_p99_ms: float | None = field(None, omit=None)  # its judged requests' send lag
    unsent: int = field(0, omit=0)  # its arrivals due and not sent (cap, or sender behind)


@dataclass(frozen=True, kw_only=True)
class RampStep:
    """A step of the ramp that found the SLA search's first rate (without --sla-start-rps)."""

    rate_rps: float
    trouble: str  # why the ramp stopped here; "" it held


@dataclass(frozen=True, kw_only=True)
class SlaResult:
    rate_rps: float | None  # the highest rate that passed; None: none did
    failed_rps: float | None  # the lowest rate that failed; None: none did
    resolution: float  # --sla-resolution: the search stops when these are this close
    probes: list[SlaProbe]
    stopped_because: str
    search_s: float  # from the first probe's start to the last verdict
    # --sla-confirm: probes repeated at rate_rps after the search, each judged alike
    confirmations: list[SlaProbe] = field(default_factory=list, omit=[])
    ramp: list[RampStep] = field(default_factory=list, omit=[])  # without --sla-start-rps
    # the objective that failed at failed_rps first (its claim furthest over its bound), or
    # "throughput" where that probe's queue did not settle
    binding: str = field("", omit="")
    # how the binding figure changes from rate_rps to failed_rps: "cliff" (it more than
    # doubles, or the queue stops settling) or "slope"
    fall: str = field("", omit="")
    # the rate the load generator could not send (its probe set aside twice): the server's
    # limit is above rate_rps, not known
    generator_limited_rps: float | None = field(None, omit=None)

    @property
    def confirmed(self) -> bool | None:
        """Every confirmation passed; None: none was run."""
        if not self.confirmations:
            return None
        return all(p.verdict == Verdict.PASS for p in self.confirmations)

    @property
    def verdict(self) -> str:
        """PASS, NOT CONFIRMED (a confirming probe did not pass) or NO ANSWER (no rate passed,
        or the load generator was the limit before the server's was found)."""
        if self.rate_rps is None or self.generator_limited_rps is not None:
            return "NO ANSWER"
        return "NOT CONFIRMED" if self.confirmed is False else "PASS"


@dataclass(frozen=True, kw_only=True)
class WorkerFigures:
    worker: int
    sent: int
    cpu_percent: float
    window_s: float


# A month: longer is a damaged file, not a soak (and would make the analysis' per-interval
# arrays, at --interval-s 0.1 s or more, tens of millions long).
MAX_RUN_S = 31 * 86400.0


@dataclass(frozen=True, kw_only=True)
class Summary:
    schema: int = SCHEMA
    run_dir: str
    started_at: str  # UTC, ISO 8601
    duration_s: float  # start -> end of the schedule
    window_s: float  # measured: end of warm-up -> end of the schedule
    config: LoadSettings
    metrics: dict[str, Stats]  # <metric>_ms
    server_time_ms: dict[str, Stats]  # the server's own queue, prefill, decode, ttft
    throughput: Throughput
    slo: SloShares
    requests: Accounting
    generator: Generator
    classes: dict[str, ClassFigures]  # empty without request classes
    server: ServerSnapshots = field(default_factory=ServerSnapshots)
    stress: StressResult | None = field(None, omit=None)
    sla: SlaResult | None = field(None, omit=None)
    workers: list[WorkerFigures] | None = field(None, omit=None)
    # what the requests sent asked for; absent where not known (a distributed run: each
    # worker sees its own prompts only)
    workload: OfferedWorkload | None = field(None, omit=None)
    reasoning: Reasoning | None = field(None, omit=None)  # absent where no stream reasoned
    sessions: SessionFigures | None = field(None, omit=None)  # sessions mode only

    def problem(self) -> tuple[str, str] | None:
        """Times that cannot be a run's (checked as summary.json is read)."""
        if not 0 <= self.duration_s <= MAX_RUN_S:
            return "duration_s", f"must be 0..{MAX_RUN_S:g} s, got {self.duration_s:g}"
        if not 0 <= self.window_s <= self.duration_s:
            return "window_s", (f"must be 0..duration_s ({self.duration_s:g} s: the window is "
                                f"part of the run), got {self.window_s:g}")
        return None
