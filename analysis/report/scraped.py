"""The report's scraped server side, for any target whose /metrics was scraped
(server_metrics.jsonl read through records/engine_maps.py): each figure with the family it came
from, what the server does not expose, the server's own TTFT and inter-token times against the
client's over the same run, queue and KV usage over time beside the client's TTFT and TPOT,
and the host's GPUs with energy per output token."""

from __future__ import annotations

import numpy as np

from analysis.readers.rundir import Run
from analysis.readers.server_metrics import (
    Figure,
    ServerSide,
    SourceSeries,
    balance_series,
    figures,
)
from analysis.readers.timeseries import ClientSeries
from analysis.tables import fmt_ms, fmt_num, fmt_percent, markdown_table
from records.metric_maps import BY_CONCEPT

# server histogram -> the client metric it is set against (histograms.json names)
AGAINST_CLIENT = {"ttft": "ttft", "itl": "itl_token", "tpot": "tpot", "e2e": "e2e",
                  "queue_time": None, "prefill_time": None, "decode_time": None}
OVER_TIME_ROWS = 12  # most rows of the over-time table


def _ratio(figs: dict[str, Figure], top: str, bottom: str) -> float | None:
    a, b = figs.get(top), figs.get(bottom)
    if a is None or b is None or not b.total:
        return None
    return a.total / b.total


def _gauge(f: Figure) -> str:
    if BY_CONCEPT[f.concept].unit == "fraction":
        return f"mean {fmt_percent(f.mean)}, max {fmt_percent(f.max)}"
    if BY_CONCEPT[f.concept].unit == "bytes":
        return f"mean {f.mean / 2**20:.1f} MiB, max {f.max / 2**20:.1f} MiB"
    return f"mean {fmt_num(f.mean, '.2f')}, max {fmt_num(f.max, '.6g')}"


def _counter(f: Figure) -> str:
    unit = BY_CONCEPT[f.concept].unit
    per = "per min" if f.concept == "preemptions" else "per s"
    rate = f.per_s * 60 if f.concept == "preemptions" and f.per_s is not None else f.per_s
    return f"{fmt_num(f.total, '.6g')} {unit} ({fmt_num(rate, '.4g')} {per})"


def figure_rows(series: SourceSeries) -> list[list[str]]:
    """figure, value, the family it came from: gauges and counters, then what follows from
    them."""
    figs = figures(series)
    rows = []
    for name, f in figs.items():
        concept = BY_CONCEPT[name]
        if name == "expert_balance":
            value = (f"{fmt_num(f.mean, '.3f')} over the run, lowest interval "
                     f"{fmt_num(f.min, '.3f')}")
        elif concept.kind == "gauge":
            value = _gauge(f)
        elif concept.kind == "counter":
            value = _counter(f)
        else:
            continue
        family = f.source.family + (f" / {f.source.per}" if f.source.per else "")
        rows.append([concept.title, value, f"`{family}`"])
    if (rate := _ratio(figs, "prefix_hits", "prefix_queries")) is not None:
        rows.append(["prefix-cache hit rate (hits / queries, tokens)", fmt_percent(rate),
                     f"`{figs['prefix_hits'].source.family}` / "
                     f"`{figs['prefix_queries'].source.family}`"])
    if (rate := _ratio(figs, "spec_accepted_tokens", "spec_draft_tokens")) is not None:
        rows.append(["speculative acceptance (accepted / draft tokens)", fmt_percent(rate),
                     f"`{figs['spec_accepted_tokens'].source.family}` / "
                     f"`{figs['spec_draft_tokens'].source.family}`"])
    return rows


def _bucket_ms(bucket: tuple[float, float] | None) -> str:
    if bucket is None:
        return "-"
    low, high = bucket
    return f"{fmt_ms(low * 1e3)}-{fmt_ms(high * 1e3) if high != float('inf') else 'inf'}"


def timing_rows(series: SourceSeries, run: Run) -> list[list[str]]:
    """The server's own histograms over the run against the client's HDR figures: the means
    side by side (a histogram's mean is exact, its percentiles only a bucket)."""
    figs, rows = figures(series), []
    for name, client_name in AGAINST_CLIENT.items():
        f = figs.get(name)
        if f is None or f.window is None:
            continue
        w = f.window
        client = run.histograms.get(client_name) if client_name else None
        seen = client is not None and client.total_count > 0
        c_mean = client.get_mean_value() / 1e3 if seen else None
        c50 = client.get_value_at_percentile(50) / 1e3 if seen else None
        s_mean = w.mean * 1e3 if w.mean is not None else None
        gap = c_mean - s_mean if c_mean is not None and s_mean is not None else None
        rows.append([BY_CONCEPT[name].title, f"{w.count:.0f}", fmt_ms(s_mean),
                     _bucket_ms(w.p50), _bucket_ms(w.p99), fmt_ms(c_mean), fmt_ms(c50),
                     fmt_ms(gap, "+")])
    return rows


def _has_prefix(series: SourceSeries) -> bool:
    return {"prefix_queries", "prefix_hits"} <= set(series.sources())


def over_time_header(series: SourceSeries) -> list[str]:
    balance = ["expert balance"] if "expert_balance" in series.sources() else []
    prefix = ["prefix hit rate"] if _has_prefix(series) else []
    return ["run s", "waiting", "running", "KV usage", *balance, *prefix,
            "client TTFT p50 (ms)", "client TPOT p50 (ms)"]


def _hit_rate(t: np.ndarray, hits: np.ndarray, queries: np.ndarray, start: float,
              end: float) -> float | None:
    """Prompt tokens hit / queried between the last scrapes at or before start and end."""
    a, b = np.searchsorted(t, start, "right") - 1, np.searchsorted(t, end, "right") - 1
    asked = queries[b] - queries[a]
    return float((hits[b] - hits[a]) / asked) if asked > 0 else None


def over_time_rows(series: SourceSeries, client: ClientSeries | None) -> list[list[str]]:
    """At most OVER_TIME_ROWS windows of the run: the server's waiting, running and KV usage
    (means of the scrapes in the window), its expert balance and prefix-cache hit rate where
    exposed, beside the client's TTFT and TPOT p50."""
    t = np.array(series.t_s)
    if len(t) < 2:
        return []
    balance_t, balance = (np.array(v) for v in balance_series(series))
    edges = np.linspace(t[0], t[-1], min(OVER_TIME_ROWS, len(t) - 1) + 1)
    gauges = {name: series.values(name) for name in ("waiting", "running", "kv_usage")
              if name in series.sources()}
    prefix = ((np.nan_to_num(series.values("prefix_hits")),
               np.nan_to_num(series.values("prefix_queries"))) if _has_prefix(series) else None)
    rows = []
    for start, end in zip(edges, edges[1:], strict=False):
        inside = (t >= start) & (t <= end)
        row = [f"{start:.0f}-{end:.0f}"]
        for name in ("waiting", "running", "kv_usage"):
            values = gauges.get(name)
            part = values[inside] if values is not None else np.array([])
            part = part[~np.isnan(part)]
            mean = float(part.mean()) if len(part) else None
            row.append(fmt_percent(mean) if name == "kv_usage" else fmt_num(mean, ".1f"))
        if "expert_balance" in series.sources():
            part = balance[(balance_t > start) & (balance_t <= end)]
            row.append(fmt_num(float(part.mean()) if len(part) else None, ".3f"))
        if prefix is not None:
            row.append(fmt_percent(_hit_rate(t, *prefix, start, end)))
        for metric in ("ttft_p50_ms", "tpot_p50_ms"):
            row.append(fmt_ms(client_mean(client, metric, start, end)))
        rows.append(row)
    return rows


def client_mean(client: ClientSeries | None, metric: str, start: float,
                 end: float) -> float | None:
    if client is None or not len(client):
        return None
    mid = client.mid_s
    values = getattr(client, metric)[(mid >= start) & (mid <= end)]
    values = values[~np.isnan(values)]
    return float(values.mean()) if len(values) else None


def gpu_rows(side: ServerSide, run: Run) -> list[list[str]]:
    """The host's GPUs: utilisation, memory, power, energy and joules per output token."""
    figs = figures(side.gpus)
    rows = []
    for name in ("gpu_utilization", "gpu_memory_bytes", "gpu_power_w"):
        if name in figs:
            rows.append([BY_CONCEPT[name].title, _gauge(figs[name])])
    if (energy := figs.get("gpu_energy_j")) is not None and energy.total is not None:
        tokens = _output_tokens(side, run)
        per_token = f", {energy.total / tokens:.4g} J per output token" if tokens else ""
        rows.append(["GPU energy", f"{energy.total:.6g} J{per_token}"])
    return rows


def _output_tokens(side: ServerSide, run: Run) -> float | None:
    """The output tokens of the energy's window: the server's count where it has one, else the
    client's over its measured window."""
    for series in side.engines:
        generated = figures(series).get("generation_tokens")
        if generated is not None and generated.total:
            return generated.total
    t = run.summary.throughput
    return t.output_tokens_per_s * t.window_s or None


def headline_figures(side: ServerSide, run: Run) -> dict | None:
    """The scraped side in a few numbers (the report's JSON line, compare's table): the first
    source's, None without one. Absent figures are None: not exposed."""
    if not side.engines:
        return None
    series = side.engines[0]
    figs = figures(series)

    def gauge(name: str, key: str) -> float | None:
        return getattr(figs[name], key) if name in figs else None

    ttft = figs.get("ttft")
    client = run.histograms.get("ttft")
    server_ms = ttft.window.mean * 1e3 if ttft and ttft.window and ttft.window.mean else None
    client_ms = client.get_mean_value() / 1e3 if client and client.total_count else None
    preempted = figs.get("preemptions")
    energy = (figures(side.gpus).get("gpu_energy_j") if side.gpus is not None else None)
    tokens = _output_tokens(side, run)
    return {
        "source": series.source, "engine": series.engines[0].engine if series.engines else None,
        "failed_scrapes": sum(series.failures.values()),
        "waiting_mean": gauge("waiting", "mean"), "waiting_max": gauge("waiting", "max"),
        "running_mean": gauge("running", "mean"),
        "kv_usage_mean": gauge("kv_usage", "mean"), "kv_usage_max": gauge("kv_usage", "max"),
        "preemptions_per_min": (preempted.per_s * 60
                                if preempted and preempted.per_s is not None else None),
        "prefix_hit_rate": (_ratio(figs, "prefix_hits", "prefix_queries")
                            if "prefix_hits" in figs else gauge("prefix_hit_rate", "mean")),
        "expert_balance": gauge("expert_balance", "mean"),
        "server_ttft_mean_ms": server_ms,
        "client_minus_server_ttft_ms": (client_ms - server_ms
                                        if client_ms is not None and server_ms is not None
                                        else None),
        "joules_per_output_token": (energy.total / tokens
                                    if energy is not None and energy.total and tokens else None),
    }


def _heading(series: SourceSeries) -> str:
    failed = sum(series.failures.values())
    parts = [f"{series.scrapes} scrapes, {len(series.t_s)} read, over "
             f"{series.duration_s:.0f} s"]
    if failed:
        parts.append(f"{failed} failed (" + "; ".join(
            f"{reason}: {n}" for reason, n in series.failures.most_common()) + ")")
    parts += [f"cut by the caps: {cut}" for cut in series.cuts]
    return ", ".join(parts)


def scraped_markdown(side: ServerSide, run: Run, client: ClientSeries | None) -> list[str]:
    parts = []
    for series in side.engines:
        parts += [f"### Scraped from {series.source} ({series.engine})", _heading(series) + "."]
        if rows := figure_rows(series):
            parts.append(markdown_table(["figure", "value", "from"], rows))
        if missing := series.missing():
            parts.append("Not exposed by this server: "
                         + ", ".join(BY_CONCEPT[m].title for m in missing) + ".")
        if rows := timing_rows(series, run):
            parts += ["#### The server's own times against the client's (ms, the whole run)",
                      "The server's histograms grew by these between the first scrape (before "
                      "the first request) and the last (after the drain); the client's are its "
                      "HDR figures over the measured window. What the client sees beyond the "
                      "server is the wire, the HTTP stack and any queue in front of the engine.",
                      markdown_table(["", "server count", "server mean", "server p50 bucket",
                                      "server p99 bucket", "client mean", "client p50",
                                      "client - server, means"], rows)]
        if rows := over_time_rows(series, client):
            parts += ["#### Queue and KV usage over time, beside the client's latency",
                      markdown_table(over_time_header(series), rows)]
    if side.gpus is not None:
        parts += ["### This host's GPUs (NVML)",
                  markdown_table(["figure", "value"], gpu_rows(side, run))]
    elif side.gpu_problem:
        parts.append(f"GPU telemetry: {side.gpu_problem}.")
    return parts


def scraped_text(side: ServerSide, run: Run) -> list[str]:
    lines = []
    for series in side.engines:
        lines.append(f"server metrics {series.source} ({series.engine}): {_heading(series)}")
        lines += [f"  {figure}: {value}" for figure, value, _ in figure_rows(series)]
        lines += [f"  {row[0]}: server mean {row[2]} ms (p50 in {row[3]} ms), client mean "
                  f"{row[5]} ms (client - server {row[7]} ms)" for row in timing_rows(series, run)]
        if missing := series.missing():
            lines.append("  not exposed by this server: "
                         + ", ".join(BY_CONCEPT[m].title for m in missing))
    if side.gpus is not None:
        lines += [f"  {figure}: {value}" for figure, value in gpu_rows(side, run)]
    elif side.gpu_problem:
        lines.append(f"GPU telemetry: {side.gpu_problem}")
    return lines
