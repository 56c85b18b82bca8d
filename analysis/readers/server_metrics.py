"""server_metrics.jsonl read through the engines' tables (records/engine_maps.py): for each
source, every concept it exposes over the run. Gauges are kept as sampled; counters and
histograms only ever grow, so a value below the last is a reset (the server restarted) and
counts from zero again, never as a negative rate. Figures over the run are between the first
and the last scrape (the collector takes one before the first send and one after the drain)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from analysis.readers.rundir import Run
from records.engine_maps import ENGINE_MAPS
from records.metric_maps import (
    BY_CONCEPT,
    CONCEPTS,
    COUNTER,
    GAUGE,
    HISTOGRAM,
    Buckets,
    EngineMap,
    Reading,
    Source,
    engines_of,
    merged,
    read,
)
from records.server_metrics import NVML, Scrape


@dataclass(frozen=True)
class Window:
    """A histogram's growth over a window: the count, the mean (exact: sum over count), and the
    bucket each percentile falls in, (low, high] (None: a summary, which has no buckets)."""

    count: float
    mean: float | None
    p50: tuple[float, float] | None
    p99: tuple[float, float] | None


@dataclass(frozen=True)
class Figure:
    """A concept over the run: a gauge's mean and max, a counter's growth and rate, a
    histogram's window; for the expert balance, the run's and the lowest interval's (min)."""

    concept: str
    source: Source
    mean: float | None = None
    max: float | None = None
    min: float | None = None
    total: float | None = None
    per_s: float | None = None
    window: Window | None = None


@dataclass
class SourceSeries:
    """One source's scrapes through its engines' tables. Built once by source_series; what is
    derived from the scrapes (the concepts found, the figures over the run) is worked out on
    first use and kept, since the report, the rules and compare each ask for it."""

    source: str
    engines: list[EngineMap]
    t_s: list[float] = field(default_factory=list)  # each ok scrape's time, run seconds
    readings: list[dict[str, tuple[Source, Reading]]] = field(default_factory=list)
    failures: Counter = field(default_factory=Counter)  # why scrapes failed -> how many
    cuts: list[str] = field(default_factory=list)
    scrapes: int = 0

    @property
    def engine(self) -> str:
        return ", ".join(e.title for e in self.engines) or "no known engine"

    def sources(self) -> dict[str, Source]:
        """Each concept found, with the source it was first read from."""
        return self._found

    @cached_property
    def _found(self) -> dict[str, Source]:
        found: dict[str, Source] = {}
        for readings in self.readings:
            for concept, (source, _) in readings.items():
                found.setdefault(concept, source)
        return found

    @cached_property
    def figures(self) -> dict[str, Figure]:
        """Each exposed concept over the run."""
        return _figures(self)

    def missing(self) -> list[str]:
        """The concepts no scrape of this source exposed (the host's GPUs are a source of their
        own and not asked of an engine)."""
        found = self.sources()
        asked = [c for c in CONCEPTS if not c.name.startswith("gpu_")] if self.source != NVML \
            else [c for c in CONCEPTS if c.name.startswith("gpu_")]
        return [c.name for c in asked if c.name not in found]

    def values(self, concept: str) -> np.ndarray:
        """A gauge as sampled (nan where a scrape lacks it); a counter's growth since the first
        scrape, summed over its label sets, each read on its own: a fall is that one's restart
        from zero, one first seen after the first scrape (a server makes its series on first
        use) grew from zero, one missing from a scrape holds its last value."""
        if BY_CONCEPT[concept].kind == GAUGE:
            return np.array([r[concept][1].value if concept in r
                             and r[concept][1].value is not None else np.nan
                             for r in self.readings], dtype=float)
        parts = self.parts(concept)
        total = np.zeros(len(parts))
        for key in {k for p in parts if p for k in p}:
            raw = np.array([p[key] if p and key in p else np.nan for p in parts])
            total += _held(grown(raw, from_zero=np.isnan(raw[0])))
        return total

    def histograms(self, concept: str) -> list[dict | None]:
        return [r[concept][1].histograms if concept in r else None for r in self.readings]

    def parts(self, concept: str) -> list[dict | None]:
        return [r[concept][1].parts if concept in r else None for r in self.readings]

    def growth(self, concept: str, first: int = 0, last: int = -1) -> Buckets | None:
        """What a histogram gained from scrape `first` to scrape `last`, each label set on its
        own (as `values` reads a counter's), then the label sets together."""
        histograms = self.histograms(concept)
        last = last % len(histograms) if histograms else 0
        window = histograms[first:last + 1]
        grew = []
        for key in {k for h in window if h for k in h}:
            series = [h.get(key) if h else None for h in window]
            from_zero = first == 0 and series[0] is None
            grew.append(bucket_growth(series, from_zero))
        return merged([g for g in grew if g is not None])

    @property
    def duration_s(self) -> float:
        return self.t_s[-1] - self.t_s[0] if len(self.t_s) > 1 else 0.0


def _held(values: np.ndarray) -> np.ndarray:
    """nan filled by the last value before it (0 before the first)."""
    out, last = np.empty(len(values)), 0.0
    for i, v in enumerate(values):
        last = last if np.isnan(v) else v
        out[i] = last
    return out


def grown(values: np.ndarray, from_zero: bool = False) -> np.ndarray:
    """A counter's growth since its first sample, a fall read as a restart from zero; nan where
    a sample is missing (the growth goes on from the last one there). from_zero: the counter did
    not exist before its first sample, so all of it is growth."""
    out = np.full(len(values), np.nan)
    total, last = 0.0, 0.0 if from_zero else None
    for i, v in enumerate(values):
        if np.isnan(v):
            continue
        if last is not None:
            total += v - last if v >= last else v
        last = v
        out[i] = total
    return out


def bucket_growth(series: list[Buckets | None], from_zero: bool = False) -> Buckets | None:
    """What one histogram (one label set) gained from its first scrape to its last: a fall in
    its count is a restart from zero; intervals before its bounds last changed, or over the
    change, are left out (their buckets cannot be added to the last ones). from_zero: it did
    not exist before its first scrape."""
    present = [b for b in series if b is not None]
    if from_zero and present:
        first = present[0]
        present.insert(0, Buckets(first.bounds, (0.0,) * len(first.counts), 0.0, 0.0))
    if len(present) < 2:
        return None
    bounds = present[-1].bounds
    counts = np.zeros(len(present[-1].counts))
    total = count = 0.0
    for before, now in zip(present, present[1:], strict=False):
        if now.count < before.count:
            before = Buckets(now.bounds, (0.0,) * len(now.counts), 0.0, 0.0)
        elif now.bounds != before.bounds:
            continue
        if now.bounds != bounds:
            continue
        counts += np.array(now.counts) - np.array(before.counts)
        total += now.sum - before.sum
        count += now.count - before.count
    return Buckets(bounds, tuple(counts), total, count)


def quantile(b: Buckets, q: float) -> tuple[float, float] | None:
    """The bucket (low, high] the q-quantile of cumulative buckets falls in: all a histogram
    knows of it (Prometheus's histogram_quantile interpolates inside it, which can read 30 ms
    for values that were all 20 ms)."""
    if not b.bounds or not b.counts or b.counts[-1] <= 0:
        return None
    rank = q * b.counts[-1]
    low = 0.0
    for bound, count in zip(b.bounds, b.counts, strict=True):
        if count >= rank:
            return low, bound
        low = bound
    return low, float("inf")


def window_of(growth: Buckets | None) -> Window | None:
    if growth is None or growth.count <= 0:
        return None
    return Window(growth.count, growth.sum / growth.count, quantile(growth, 0.5),
                  quantile(growth, 0.99))


def balance_of(first: dict | None, last: dict | None) -> float | None:
    """Balancedness (mean over max) of each group's growth between two scrapes, averaged over
    the groups (a model's layers); None where nothing grew."""
    if not last:
        return None
    groups: dict[tuple, list[float]] = {}
    for key, value in last.items():
        groups.setdefault(key[:-1], []).append(value - (first or {}).get(key, 0.0))
    balances = [float(np.mean(g)) / max(g) for g in groups.values() if max(g) > 0]
    return float(np.mean(balances)) if balances else None


def _balance(series: SourceSeries, first: int, last: int) -> float | None:
    """The expert balance from scrape `first` to `last`: of the counters' growth per expert,
    or a Summary's mean (SGLang's) over the window."""
    parts = series.parts("expert_balance")
    if any(p is not None for p in parts):
        before = parts[first]
        if before is None and first:  # missing from that scrape: the interval is unknown
            return None
        return balance_of(before or {}, parts[last])  # none at the first: it grew from zero
    grew = series.growth("expert_balance", first, last)
    return grew.sum / grew.count if grew is not None and grew.count > 0 else None


def balance_series(series: SourceSeries) -> tuple[list[float], list[float]]:
    """(times, balancedness in each interval between scrapes) for the expert balance."""
    times, values = [], []
    if "expert_balance" not in series.sources():
        return times, values
    for i in range(1, len(series.t_s)):
        value = _balance(series, i - 1, i)
        if value is not None:
            times.append(series.t_s[i])
            values.append(value)
    return times, values


def figures(series: SourceSeries) -> dict[str, Figure]:
    """Each exposed concept over the run (worked out once per series)."""
    return series.figures


def _figures(series: SourceSeries) -> dict[str, Figure]:
    out = {}
    for concept, source in series.sources().items():
        kind = BY_CONCEPT[concept].kind
        if concept == "expert_balance":
            _, over_time = balance_series(series)
            value = _balance(series, 0, len(series.t_s) - 1) if len(series.t_s) > 1 else None
            out[concept] = Figure(concept, source, mean=value,
                                  min=min(over_time) if over_time else None)
        elif kind == HISTOGRAM:
            out[concept] = Figure(concept, source, window=window_of(series.growth(concept)))
        elif kind == COUNTER:
            grew = series.values(concept)
            known = grew[~np.isnan(grew)]
            total = float(known[-1]) if len(known) else None
            per_s = (total / series.duration_s if total is not None and series.duration_s > 0
                     else None)
            out[concept] = Figure(concept, source, total=total, per_s=per_s)
        else:
            v = series.values(concept)
            v = v[~np.isnan(v)]
            if len(v):
                out[concept] = Figure(concept, source, mean=float(v.mean()), max=float(v.max()))
    return out


def source_series(scrapes: list[Scrape]) -> list[SourceSeries]:
    """The scrapes by source, in the order they first appear, each through the tables of the
    engines its scrapes show."""
    by_source: dict[str, SourceSeries] = {}
    for scrape in scrapes:
        series = by_source.setdefault(scrape.source, SourceSeries(scrape.source, []))
        series.scrapes += 1
        if not scrape.ok:
            series.failures[scrape.error] += 1
            continue
        if scrape.cut and scrape.cut not in series.cuts:
            series.cuts.append(scrape.cut)
        for engine in engines_of(scrape, ENGINE_MAPS):
            if engine not in series.engines:
                series.engines.append(engine)
        series.t_s.append(scrape.t_run_s)
        series.readings.append(read(scrape, series.engines))
    return list(by_source.values())


@dataclass(frozen=True)
class ServerSide:
    """A run's scraped server side: the engines' sources and the host's GPUs."""

    engines: list[SourceSeries]  # every source but NVML
    gpus: SourceSeries | None  # the host's GPUs, where NVML saw any
    gpu_problem: str  # why there are none ("" where there are, or NVML was not asked)

    def __bool__(self) -> bool:
        return bool(self.engines or self.gpus)


def server_side(run: Run) -> ServerSide:
    every = source_series(run.scrapes)
    gpus = next((s for s in every if s.source == NVML), None)
    problem = ""
    if gpus is not None and not gpus.t_s:
        problem = next(iter(gpus.failures), "no GPU reading")
        gpus = None
    return ServerSide([s for s in every if s.source != NVML], gpus, problem)
