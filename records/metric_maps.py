"""What a scrape of a server's /metrics says, in our concepts: one table per engine family
(records/engine_maps.py) from its metric names to the concepts below, and the reading of one
scrape through it. The analysis turns readings over time into rates and windows
(analysis/readers/server_metrics.py); the web UI shows the gauges live.

A concept a server does not expose has no reading: reports say "not exposed by this server",
never a zero."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from records.server_metrics import Family, Sample, Scrape

GAUGE, COUNTER, HISTOGRAM = "gauge", "counter", "histogram"


@dataclass(frozen=True)
class Concept:
    name: str
    kind: str  # GAUGE (now), COUNTER (grows), HISTOGRAM (of seconds, grows)
    unit: str
    title: str
    combine: str = "sum"  # over the samples a source matches (ranks, engines): sum or mean


CONCEPTS: tuple[Concept, ...] = (
    Concept("waiting", GAUGE, "requests", "requests waiting"),
    Concept("running", GAUGE, "requests", "requests running"),
    Concept("running_tokens", GAUGE, "tokens", "tokens in the running batch"),
    Concept("kv_usage", GAUGE, "fraction", "KV-cache usage", "mean"),
    Concept("preemptions", COUNTER, "requests", "preemptions"),
    Concept("prefix_queries", COUNTER, "tokens", "prefix-cache queries"),
    Concept("prefix_hits", COUNTER, "tokens", "prefix-cache hits"),
    Concept("prefix_hit_rate", GAUGE, "fraction", "prefix-cache hit rate (the server's gauge)",
            "mean"),
    Concept("prompt_tokens", COUNTER, "tokens", "prompt tokens"),
    Concept("generation_tokens", COUNTER, "tokens", "generated tokens"),
    Concept("requests_finished", COUNTER, "requests", "requests finished"),
    Concept("ttft", HISTOGRAM, "s", "time to first token"),
    Concept("itl", HISTOGRAM, "s", "inter-token latency"),
    Concept("tpot", HISTOGRAM, "s", "time per output token"),
    Concept("e2e", HISTOGRAM, "s", "end-to-end request latency"),
    Concept("queue_time", HISTOGRAM, "s", "queue time"),
    Concept("prefill_time", HISTOGRAM, "s", "prefill time"),
    Concept("decode_time", HISTOGRAM, "s", "decode time"),
    Concept("write_delay", HISTOGRAM, "s", "the server's write delay (a streamed message, "
            "stamped -> the transport took it)"),
    Concept("spec_draft_tokens", COUNTER, "tokens", "speculative draft tokens"),
    Concept("spec_accepted_tokens", COUNTER, "tokens", "speculative tokens accepted"),
    Concept("spec_accept_length", GAUGE, "tokens", "speculative accept length (the server's "
            "gauge)", "mean"),
    Concept("expert_balance", GAUGE, "ratio", "expert balancedness (mean / max load; 1 is "
            "even)", "mean"),
    Concept("gpu_utilization", GAUGE, "fraction", "GPU utilisation", "mean"),
    Concept("gpu_memory_bytes", GAUGE, "bytes", "GPU memory used"),
    Concept("gpu_power_w", GAUGE, "W", "GPU power"),
    Concept("gpu_energy_j", COUNTER, "J", "GPU energy"),
    Concept("rss_bytes", GAUGE, "bytes", "server resident memory"),
)
BY_CONCEPT = {c.name: c for c in CONCEPTS}


@dataclass(frozen=True)
class Source:
    """Where a concept is read: a family, the samples whose labels match, times `scale` to our
    unit; `per`: a gauge divided by this family (used / total); `balance`: a counter by this label
    (an expert, a rank), read as the balancedness of its growth (mean over max)."""

    family: str
    labels: tuple[tuple[str, str], ...] = ()
    scale: float = 1.0
    per: str = ""
    per_labels: tuple[tuple[str, str], ...] = ()  # of `per`'s samples; default `labels`
    balance: str = ""
    since: str = ""  # the engine's release that has it, where known


@dataclass(frozen=True)
class EngineMap:
    engine: str
    title: str
    marks: tuple[str, ...]  # family-name prefixes that tell this engine's scrape
    cited: str  # where its names were read
    reads: dict[str, tuple[Source, ...]]  # concept -> its sources, the first one present wins


@dataclass(frozen=True)
class Buckets:
    """A histogram's (or a summary's) cumulative state at one scrape: counts[i] of values <=
    bounds[i] (no bounds: a summary)."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float
    count: float


Key = tuple[str, ...]  # a sample's labels as sorted "name=value", its buckets' `le` left out


@dataclass(frozen=True)
class Reading:
    """A concept at one scrape: a gauge's or counter's number (over every matched label set);
    a counter's value per label set (each resets on its own); a histogram's buckets per label
    set; or for a balance the counter of each label set (the balanced label's value last)."""

    value: float | None = None
    parts: dict[Key, float] | None = None
    histograms: dict[Key, Buckets] | None = None

    @property
    def buckets(self) -> Buckets | None:
        return merged(list(self.histograms.values())) if self.histograms else None


def merged(histograms: list[Buckets]) -> Buckets | None:
    """Several label sets' buckets as one: the counts of those sharing the commonest bounds
    (others' buckets cannot be added to them), the sum and count of all."""
    if not histograms:
        return None
    by_bounds: dict[tuple[float, ...], float] = {}
    for b in histograms:
        by_bounds[b.bounds] = by_bounds.get(b.bounds, 0.0) + b.count
    bounds = max(by_bounds, key=by_bounds.get)
    same = [b for b in histograms if b.bounds == bounds]
    counts = tuple(map(sum, zip(*(b.counts for b in same), strict=True))) if bounds else ()
    return Buckets(bounds, counts, sum(b.sum for b in histograms),
                   sum(b.count for b in histograms))


def _matches(sample: Sample, labels: tuple[tuple[str, str], ...]) -> bool:
    return all(sample.labels.get(k) == v for k, v in labels)


def _key(sample: Sample) -> Key:
    return tuple(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "le")


def _series(family: Family, names: Iterable[str], labels) -> dict[Key, float]:
    """The value of each label set of the matched samples."""
    names, out = set(names), {}
    for s in family.samples:
        if s.name in names and s.value is not None and _matches(s, labels):
            out[_key(s)] = out.get(_key(s), 0.0) + s.value
    return out


def _combine(values: Iterable[float], how: str) -> float | None:
    values = list(values)
    if not values:
        return None
    return sum(values) / len(values) if how == "mean" else sum(values)


def _histograms(family: Family, labels, scale: float) -> dict[Key, Buckets]:
    """Each label set's buckets, bounds and sum times scale; a bucket whose `le` is no number
    is left out."""
    parts: dict[Key, dict] = {}
    for s in family.samples:
        if s.value is None or not _matches(s, labels):
            continue
        part = parts.setdefault(_key(s), {"bounds": {}, "sum": 0.0, "count": 0.0})
        if s.name.endswith("_bucket") and "le" in s.labels:
            try:
                bound = float(s.labels["le"])
            except ValueError:
                continue
            part["bounds"][bound] = part["bounds"].get(bound, 0.0) + s.value
        elif s.name.endswith("_sum"):
            part["sum"] += s.value
        elif s.name.endswith("_count"):
            part["count"] += s.value
    out = {}
    for key, part in parts.items():
        bounds = sorted(part["bounds"])
        if bounds or part["count"]:
            out[key] = Buckets(tuple(b * scale for b in bounds),
                               tuple(part["bounds"][b] for b in bounds), part["sum"] * scale,
                               part["count"])
    return out


def _parts(family: Family, source: Source) -> dict[Key, float] | None:
    parts: dict[Key, float] = {}
    for s in family.samples:
        if s.value is None or source.balance not in s.labels or not _matches(s, source.labels):
            continue
        others = tuple(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != source.balance)
        key = (*others, s.labels[source.balance])
        parts[key] = parts.get(key, 0.0) + s.value
    return parts or None


def read_source(scrape: Scrape, concept: Concept, source: Source) -> Reading | None:
    family = scrape.family(source.family)
    if family is None:
        return None
    name = family.name
    if source.balance:
        parts = _parts(family, source)
        return Reading(parts=parts) if parts else None
    if family.type in ("histogram", "summary", "gaugehistogram"):
        histograms = _histograms(family, source.labels, source.scale)
        if not histograms:
            return None
        if concept.kind == COUNTER:  # a histogram of sizes: its sum is the total (TGI's tokens)
            parts = {key: b.sum for key, b in histograms.items()}
            return Reading(value=sum(parts.values()), parts=parts)
        return Reading(histograms=histograms)
    series = _series(family, (name, f"{name}_total", source.family), source.labels)
    value = _combine(series.values(), concept.combine)
    if value is None:
        return None
    if source.per:
        total = scrape.family(source.per)
        den = _combine(_series(total, (total.name, f"{total.name}_total"),
                               source.per_labels or source.labels).values(),
                       concept.combine) if total else None
        if not den:
            return None
        return Reading(value=value / den * source.scale)
    return Reading(value=value * source.scale,
                   parts={k: v * source.scale for k, v in series.items()})


def read(scrape: Scrape, engines: list[EngineMap]) -> dict[str, tuple[Source, Reading]]:
    """Each concept the scrape holds under the engines' tables (the first that has it): the
    source it came from and its reading; a concept without one is not exposed."""
    out: dict[str, tuple[Source, Reading]] = {}
    for engine in engines:
        for concept, sources in engine.reads.items():
            for source in sources if concept not in out else ():
                reading = read_source(scrape, BY_CONCEPT[concept], source)
                if reading is not None:
                    out[concept] = (source, reading)
                    break
    return out


def engines_of(scrape: Scrape, maps: tuple[EngineMap, ...]) -> list[EngineMap]:
    """The tables whose families the scrape holds, the one with most of them first (Triton's
    page carries its vLLM backend's families beside its own)."""
    def marked(engine: EngineMap) -> int:
        return sum(1 for f in scrape.families if f.name.startswith(engine.marks))
    found = [(marked(e), i, e) for i, e in enumerate(maps)]
    return [e for n, _, e in sorted(found, key=lambda t: (-t[0], t[1])) if n]
