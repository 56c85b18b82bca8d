"""server_metrics.jsonl read through the engines' tables (records/engine_maps.py): for each
source, every concept it exposes over the run. Gauges are kept as sampled; counters and
histograms only ever grow, so a value below the last is a reset (the server restarted) and
counts from zero again, never as a negative rate. Figures over the run are between the first
and the last scrape (the collector takes one before the first send and one after the drain)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

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
    histogram's window."""

    concept: str
    source: Source
    mean: float | None = None
    max: float | None = None
    total: float | None = None
    per_s: float | None = None
    window: Window | None = None


@dataclass
class SourceSeries:
    """One source's scrapes through its engines' tables."""

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
        found: dict[str, Source] = {}
        for readings in self.readings:
            for concept, (source, _) in readings.items():
                found.setdefault(concept, source)
        return found

    def missing(self) -> list[str]:
        """The concepts no scrape of this source exposed (the host's GPUs are a source of their
        own and not asked of an engine)."""
        found = self.sources()
        asked = [c for c in CONCEPTS if not c.name.startswith("gpu_")] if self.source != NVML \
            else [c for c in CONCEPTS if c.name.startswith("gpu_")]
        return [c.name for c in asked if c.name not in found]

    def values(self, concept: str) -> np.ndarray:
        """A gauge as sampled, a counter's growth since the first scrape (resets counted from
        zero); nan where a scrape lacks it."""
        raw = np.array([r[concept][1].value if concept in r and r[concept][1].value is not None
                        else np.nan for r in self.readings], dtype=float)
        return raw if BY_CONCEPT[concept].kind == GAUGE else grown(raw)

    def buckets(self, concept: str) -> list[Buckets | None]:
        return [r[concept][1].buckets if concept in r else None for r in self.readings]

    def parts(self, concept: str) -> list[dict | None]:
        return [r[concept][1].parts if concept in r else None for r in self.readings]

    @property
    def duration_s(self) -> float:
        return self.t_s[-1] - self.t_s[0] if len(self.t_s) > 1 else 0.0


def grown(values: np.ndarray) -> np.ndarray:
    """A counter's growth since its first sample, a fall read as a restart from zero; nan where
    a sample is missing (the growth goes on from the last one there)."""
    out = np.full(len(values), np.nan)
    total, last = 0.0, None
    for i, v in enumerate(values):
        if np.isnan(v):
            continue
        if last is not None:
            total += v - last if v >= last else v
        last = v
        out[i] = total
    return out


def bucket_growth(series: list[Buckets | None]) -> Buckets | None:
    """What a histogram gained from its first scrape to its last, a fall in its count (or
    other bounds) read as a restart from zero."""
    present = [b for b in series if b is not None]
    if len(present) < 2:
        return None
    counts = np.zeros(len(present[-1].counts))
    total = count = 0.0
    for before, now in zip(present, present[1:], strict=False):
        if now.bounds != before.bounds or now.count < before.count:
            before = Buckets(now.bounds, (0.0,) * len(now.counts), 0.0, 0.0)
        if len(now.counts) == len(counts):
            counts += np.array(now.counts) - np.array(before.counts)
        total += now.sum - before.sum
        count += now.count - before.count
    return Buckets(present[-1].bounds, tuple(counts), total, count)


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


def balance_series(series: SourceSeries) -> tuple[list[float], list[float]]:
    """(times, balancedness in each interval between scrapes) for the expert balance."""
    times, values = [], []
    if "expert_balance" not in series.sources():
        return times, values
    parts, buckets = series.parts("expert_balance"), series.buckets("expert_balance")
    for i in range(1, len(series.t_s)):
        if parts[i] is not None:
            value = balance_of(parts[i - 1], parts[i])
        else:
            grew = bucket_growth([buckets[i - 1], buckets[i]])
            value = grew.sum / grew.count if grew is not None and grew.count > 0 else None
        if value is not None:
            times.append(series.t_s[i])
            values.append(value)
    return times, values


def figures(series: SourceSeries) -> dict[str, Figure]:
    """Each exposed concept over the run."""
    out = {}
    for concept, source in series.sources().items():
        kind = BY_CONCEPT[concept].kind
        if concept == "expert_balance":
            parts, buckets = series.parts(concept), series.buckets(concept)
            if any(p is not None for p in parts):
                known = [p for p in parts if p is not None]
                value = balance_of(known[0], known[-1]) if len(known) > 1 else None
            else:
                grew = bucket_growth(buckets)
                value = grew.sum / grew.count if grew is not None and grew.count > 0 else None
            _, over_time = balance_series(series)
            out[concept] = Figure(concept, source, mean=value,
                                  max=min(over_time) if over_time else None)
        elif kind == HISTOGRAM:
            out[concept] = Figure(concept, source,
                                  window=window_of(bucket_growth(series.buckets(concept))))
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
