"""Per-metric estimates of runs and their comparison: each run's point estimate with a bootstrap
confidence interval, each run against a baseline as a ratio with its interval and a verdict, and
the best run (statistics in analysis/bootstrap.py).

Latency percentiles (TTFT, TPOT, E2E at p50 and p99) are read from each run's histograms.json;
their intervals come from a bootstrap over the run's measured requests (requests.jsonl rows that
finished OK after the warm-up), each value taken as its HDR bucket reports it so that point
estimate and interval speak of the same numbers. Output tokens/s and goodput are rebuilt from
requests.jsonl over the measured window as the load generator counts them (a request counts when
its last message lands in the window: scheduled send + E2E, since E2E counts from the scheduled
send) and bootstrapped over the window's --interval-s bins. requests.jsonl has no per-token
times, so a request's tokens are placed evenly between its first and last message: tokens/s can
differ from summary.json where requests straddle the window's edges (a note gives the
difference), and tokens of failed requests are not counted. A run whose rows are missing,
too few, or not the whole run (a row per request sent, and as many measured ones as the
histograms count) gets a point estimate only, and says why: a bootstrap over part of a run
would give intervals about some other sample, even ones that miss the run's own figures.
Goodput of runs judged against different SLOs is not compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from analysis import bootstrap
from analysis.readers.latency import US_PER_MS
from analysis.readers.rows import column, measured_ok
from analysis.readers.rundir import Run
from records.hdr import percentile_us
from records.load_settings import SloSettings
from records.requests import RequestRow
from records.rundir import REQUESTS

MIN_REQUESTS = 10  # fewer measured values than this: no interval for a percentile
MIN_BINS = 10  # fewer window bins than this: no interval for a rate
MIN_BEYOND = 5  # fewer values above a percentile than this: its interval is marked rough
LATENCY = ("ttft", "tpot", "e2e")  # histograms.json names, requests.jsonl columns {name}_ms


@dataclass(frozen=True)
class HeadlineMetric:
    key: str  # as in the JSON headline
    label: str
    unit: str
    lower_is_better: bool
    source: str  # histogram / requests.jsonl column (ttft, tpot, e2e), or a rate: tokens, good
    q: float | None = None  # percentile; None for a rate


METRICS = (
    HeadlineMetric("ttft_p50_ms", "TTFT p50", "ms", True, "ttft", 50.0),
    HeadlineMetric("ttft_p99_ms", "TTFT p99", "ms", True, "ttft", 99.0),
    HeadlineMetric("tpot_p50_ms", "TPOT p50", "ms", True, "tpot", 50.0),
    HeadlineMetric("tpot_p99_ms", "TPOT p99", "ms", True, "tpot", 99.0),
    HeadlineMetric("e2e_p50_ms", "E2E p50", "ms", True, "e2e", 50.0),
    HeadlineMetric("e2e_p99_ms", "E2E p99", "ms", True, "e2e", 99.0),
    HeadlineMetric("output_tokens_per_s", "output tokens/s", "tokens/s", False, "tokens"),
    HeadlineMetric("goodput_requests_per_s", "goodput", "requests/s", False, "good"),
)


@dataclass(frozen=True)
class RunSample:
    """What one run's requests.jsonl offers the bootstrap."""

    problem: str  # why the rows cannot be used ("" when they can)
    # ttft/tpot/e2e -> measured ok values
    latency_ms: dict[str, np.ndarray] = field(default_factory=dict)
    lengths_s: np.ndarray | None = None  # the measured window's bins
    per_bin: dict[str, np.ndarray] = field(default_factory=dict)  # tokens/good -> count in each bin


@dataclass(frozen=True)
class Estimate:
    value: float | None  # the point estimate
    draws: np.ndarray | None = None  # bootstrap draws; None when there is no interval
    ci: tuple[float, float] | None = None
    no_interval: str = ""  # why there is none
    # the percentile sits among the sample's last few values: the interval is rough
    rough: bool = False
    notes: tuple[str, ...] = ()


# --- what each run offers: requests.jsonl rows, binned over the measured window ---

def run_sample(run: Run) -> RunSample:
    if not (run.path / REQUESTS).exists():
        return RunSample(f"{REQUESTS} missing")
    rows = run.rows
    measured = measured_ok(rows)
    latency = {name: values[~np.isnan(values)] for name in LATENCY
               for values in [column(measured, f"{name}_ms")]}
    if problem := incomplete(run, rows, latency):
        return RunSample(problem)
    edges = window_edges_ms(run)
    if edges is None:
        return RunSample("", latency)
    done = [r for r in rows if r.status == "OK" and r.ttft_ms is not None and r.e2e_ms is not None]
    finish_ms = column(done, "scheduled_ms") + column(done, "e2e_ms")
    good = finish_ms[_meets_slo(done, run.summary.config.slo)]
    per_bin = {"tokens": tokens_per_bin(done, edges),
               "good": np.histogram(good, edges)[0].astype(float)}
    return RunSample("", latency, np.diff(edges) / 1000, per_bin)


def incomplete(run: Run, rows: list[RequestRow], latency_ms: dict[str, np.ndarray]) -> str:
    """Why the rows are not the whole run ("" when they are): the load generator writes a row per
    request it sent (summary.json's requests.sent) and the histograms hold the measured OK
    ones."""
    sent, omitted = run.summary.requests.sent, run.summary.requests.rows_omitted
    if omitted:
        return (f"{REQUESTS} holds {len(rows)} of the {sent} requests ({omitted} past "
                f"--max-request-rows): point estimate only")
    if len(rows) < sent:
        return f"{REQUESTS} holds {len(rows)} of the {sent} requests: point estimate only"
    if len(rows) > sent:
        return (f"{REQUESTS} holds {len(rows)} rows, summary.json counts {sent} requests: "
                "point estimate only")
    for name, values in latency_ms.items():
        hist = run.histograms.get(name)
        if hist is not None and len(values) != hist.get_total_count():
            return (f"{REQUESTS} holds {len(values)} measured {name} values, histograms.json "
                    f"{hist.get_total_count()}: point estimate only")
    return ""


def window_edges_ms(run: Run) -> np.ndarray | None:
    """Bin edges over the measured window (end of warm-up -> end of schedule), ms after the run's
    start: --interval-s bins, the last one shorter when the window is not a whole number of
    them."""
    recording = run.summary.config.recording
    window_s = run.summary.window_s
    if window_s <= 0:
        return None
    start_ms, end_ms = recording.warmup_s * 1000, (recording.warmup_s + window_s) * 1000
    edges = np.arange(start_ms, end_ms, recording.interval_s * 1000)
    if end_ms - edges[-1] < 1e-3:  # a sliver of a bin left by float steps
        edges = edges[:-1]
    return np.append(edges, end_ms)


def slos(run: Run) -> SloSettings:
    """The objectives the run's goodput was judged by."""
    return run.summary.config.slo


def _meets_slo(rows: list[RequestRow], slo: SloSettings) -> np.ndarray:
    """As the load generator judges (loadgen/recording/slo.py): every objective given; a
    one-token request has no TPOT and meets it."""
    met = np.ones(len(rows), dtype=bool)
    for name in LATENCY:
        if (limit := getattr(slo, f"slo_{name}_ms")) is not None:
            values = column(rows, f"{name}_ms")
            met &= np.isnan(values) | (values <= limit)
    return met


def tokens_per_bin(rows: list[RequestRow], edges_ms: np.ndarray) -> np.ndarray:
    """Output tokens received in each bin (a, b], a request's messages placed evenly between its
    first and last."""
    first = column(rows, "scheduled_ms") + column(rows, "ttft_ms")
    last = column(rows, "scheduled_ms") + column(rows, "e2e_ms")
    messages = np.asarray([r.messages or r.output_tokens or 1 for r in rows], dtype=float)
    per_message = np.nan_to_num(column(rows, "output_tokens")) / messages
    step = (last - first) / np.maximum(messages - 1, 1)

    def received_by(t_ms: np.ndarray, r: np.ndarray) -> np.ndarray:
        """Tokens of requests r received at or before t_ms (one time per request)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            spread = np.floor((t_ms - first[r]) / step[r]) + 1
        count = np.where(step[r] > 0, spread, np.where(t_ms >= first[r], messages[r], 0))
        return np.clip(count, 0, messages[r]) * per_message[r]

    # A request's running total changes only between the last edge before its first message and
    # the first edge at or after its last one, so the loop runs over the longest request's bins,
    # not the whole window.
    lo = np.clip(np.searchsorted(edges_ms, first) - 1, 0, len(edges_ms) - 1)
    hi = np.clip(np.searchsorted(edges_ms, last), 0, len(edges_ms) - 1)
    per_bin = np.zeros(len(edges_ms) - 1)
    before = received_by(edges_ms[lo], np.arange(len(rows)))
    for offset in range(1, int((hi - lo).max(initial=0)) + 1):
        live = np.nonzero(lo + offset <= hi)[0]
        now = received_by(edges_ms[lo[live] + offset], live)
        np.add.at(per_bin, lo[live] + offset - 1, now - before[live])
        before[live] = now
    return per_bin


# --- estimates and comparisons ---

def estimate(run: Run, sample: RunSample, metric: HeadlineMetric, resamples: int, confidence: float,
             rng: np.random.Generator) -> Estimate:
    return (_percentile_estimate if metric.q is not None else _rate_estimate)(
        run, sample, metric, resamples, confidence, rng)


def _percentile_estimate(run, sample, metric, resamples, confidence, rng) -> Estimate:
    hist = run.histograms.get(metric.source)
    if hist is None or hist.get_total_count() == 0:
        return Estimate(None, no_interval="no samples")
    value = percentile_us(hist, metric.q) / US_PER_MS
    if sample.problem:
        return Estimate(value, no_interval=sample.problem)
    # as many as the histogram holds (incomplete())
    values = sample.latency_ms.get(metric.source, np.empty(0))
    n = len(values)
    if n < MIN_REQUESTS:
        return Estimate(value, no_interval=f"too few requests for an interval ({n})")
    # The recorded value is monotone in the raw one, so only the drawn values need mapping.
    draws = as_recorded(bootstrap.percentile_draws(values, metric.q, resamples, rng), hist)
    rough = n - bootstrap.rank(n, metric.q) < MIN_BEYOND
    return Estimate(value, draws, bootstrap.interval(draws, confidence), rough=rough)


def as_recorded(values_ms: np.ndarray, hist) -> np.ndarray:
    """Each value as the histogram reports it: the highest value of its bucket (integer us, as
    recorded)."""
    unique, inverse = np.unique(np.floor(values_ms * US_PER_MS + 1e-6).astype(np.int64),
                                return_inverse=True)
    top_us = np.asarray([hist.get_highest_equivalent_value(int(v)) for v in unique], dtype=float)
    return top_us[inverse] / US_PER_MS


def _rate_estimate(run, sample, metric, resamples, confidence, rng) -> Estimate:
    """The summary's figure, with the interval of the rate rebuilt from requests.jsonl's
    window intervals, scaled to it: one figure, the same as the table's."""
    reported = getattr(run.summary.throughput, metric.key)
    if sample.problem or sample.lengths_s is None:
        return Estimate(reported, no_interval=sample.problem or "summary.json has no window_s")
    counts = sample.per_bin[metric.source]
    rebuilt = float(counts.sum() / sample.lengths_s.sum())
    value = rebuilt if reported is None else reported
    notes = ()
    if reported is not None and abs(rebuilt - reported) > 0.005 * max(abs(reported), 1e-9):
        off = 100 * (rebuilt - reported) / reported if reported else math.inf
        notes = (f"its interval is the bootstrap of the rate rebuilt from {REQUESTS}'s window "
                 f"intervals ({rebuilt:.4g}, {off:+.1f}%), scaled to summary.json's "
                 f"{reported:.4g}",)
    if len(counts) < MIN_BINS:
        return Estimate(value, no_interval=f"too few intervals for an interval ({len(counts)})",
                        notes=notes)
    draws = bootstrap.rate_draws(counts, sample.lengths_s, resamples, rng)
    if rebuilt > 0:
        draws = draws * (value / rebuilt)
    return Estimate(value, draws, bootstrap.interval(draws, confidence), notes=notes)


def versus(a: Estimate, b: Estimate, metric: HeadlineMetric, confidence: float) -> dict:
    """Run a against run b: ratio a / b, its interval, verdict and the sentence saying so."""
    if a.value is None or b.value is None:
        return {"ratio": None, "ci": None, "verdict": None, "text": "-"}
    r = float(bootstrap.ratio(a.value, b.value))
    if a.draws is None or b.draws is None:
        why = a.no_interval or b.no_interval
        return {"ratio": r, "ci": None, "verdict": None,
                "text": f"{bootstrap.fmt_ratio(r)}, no interval ({why})"}
    low, high = bootstrap.interval(bootstrap.ratio(a.draws, b.draws), confidence)
    verdict = bootstrap.verdict(low, high, metric.lower_is_better)
    ratio_text = span(r, [low, high])
    text = (f"{verdict} ({ratio_text})" if verdict == bootstrap.SAME
            else f"{ratio_text}, {verdict}")
    return {"ratio": r, "ci": [low, high], "verdict": verdict, "text": text}


def span(r: float, ci: list[float]) -> str:
    """x1.72 [1.41, 2.05]"""
    return (f"{bootstrap.fmt_ratio(r)} "
            f"[{bootstrap.fmt_ratio(ci[0])[1:]}, {bootstrap.fmt_ratio(ci[1])[1:]}]")


def compare_metric(metric: HeadlineMetric, names: list[str], estimates: list[Estimate],
                   baseline: int, confidence: float, incomparable: str = "") -> dict:
    """Each run against the baseline and the best run; incomparable: why the runs' values do not
    compare (each run keeps its own value and interval, but there is no ratio, verdict or best
    run)."""
    runs = []
    for i, (name, e) in enumerate(zip(names, estimates, strict=True)):
        if i == baseline:
            against = {"ratio": 1.0, "ci": None, "verdict": "baseline", "text": "baseline"}
        elif incomparable:
            against = {"ratio": None, "ci": None, "verdict": None,
                       "text": f"not compared ({incomparable})"}
        else:
            against = versus(e, estimates[baseline], metric, confidence)
        runs.append({"run": name, "value": e.value, "ci": list(e.ci) if e.ci else None,
                     "rough_interval": e.rough, "no_interval": e.no_interval or None,
                     "notes": list(e.notes), "vs_baseline": against})
    if incomparable:
        return {"label": metric.label, "unit": metric.unit,
                "lower_is_better": metric.lower_is_better, "best": None, "second": None,
                "best_vs_second": None, "significantly_best": False,
                "best_text": f"not compared ({incomparable})", "runs": runs}
    ranked = sorted((i for i, e in enumerate(estimates) if e.value is not None),
                    key=lambda i: estimates[i].value, reverse=not metric.lower_is_better)
    result = {"label": metric.label, "unit": metric.unit, "lower_is_better": metric.lower_is_better,
              "best": names[ranked[0]] if ranked else None, "second": None, "best_vs_second": None,
              "significantly_best": False, "best_text": "no run has a value" if not ranked else
              f"{names[ranked[0]]} (the only run with a value)", "runs": runs}
    if len(ranked) > 1:
        best, second = ranked[:2]
        against = versus(estimates[best], estimates[second], metric, confidence)
        significant = against["verdict"] == "better"
        text = (f"significantly better than {names[second]} "
                f"({span(against['ratio'], against['ci'])})" if significant
                else f"best by its point estimate; against {names[second]}: {against['text']}")
        result |= {"second": names[second], "best_vs_second": against,
                   "significantly_best": significant, "best_text": text}
    return result


def analyse(runs: list[Run], names: list[str], baseline: int, confidence: float, resamples: int,
            seed: int) -> dict[str, dict]:
    """Every metric's comparison, from each run's estimate. Each (run, metric) draws from its own
    seeded stream."""
    samples = [run_sample(r) for r in runs]
    estimates = {m.key: [estimate(run, sample, m, resamples, confidence,
                                  np.random.default_rng([seed, i, j]))
                         for i, (run, sample) in enumerate(zip(runs, samples, strict=True))]
                 for j, m in enumerate(METRICS)}
    other_slos = "the runs used different SLOs" if len({slos(r) for r in runs}) > 1 else ""
    comparisons = {m.key: compare_metric(m, names, estimates[m.key], baseline, confidence,
                                         other_slos if m.source == "good" else "") for m in METRICS}
    return comparisons


