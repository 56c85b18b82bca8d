"""The figures the web UI's tabs, the --csv latency file and the HTML report show: TTFT, TPOT,
ITL and end-to-end percentiles from the HDR histograms (live from a running test's recorder, or
from a finished run's summary), and a finished run's headline."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from loadgen.recording.recorder import Recorder
from records.summary import Stats, Summary

METRICS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL (per message)",
           "itl_token": "ITL (per token)", "e2e": "end-to-end", "send_lag": "send lag"}
COLUMNS = {"metric": "Metric", "count": "Requests or gaps", "p50": "p50 (ms)", "p90": "p90 (ms)",
           "p95": "p95 (ms)", "p99": "p99 (ms)", "max": "max (ms)"}


NO_TEST = ("no test in this process yet (a distributed run's master shows the figures in its "
           "report when the workers finish)")


def live(recorder: Recorder | None) -> dict[str, Stats] | None:
    """The figures of the test running in this process (or the last one), by METRICS key."""
    return None if recorder is None else {name: recorder.client[name].stats() for name in METRICS}


def ended(summary: Summary) -> dict[str, Stats]:
    """The same figures from a finished run's summary (a distributed run's merged one too)."""
    return {name: summary.metrics.get(f"{name}_ms", Stats(count=0)) for name in METRICS}


def rows(figures: Mapping[str, Stats] | None) -> list[dict]:
    """The table's rows, by COLUMNS key."""
    if figures is None:
        return [{"metric": NO_TEST}]
    out = []
    for name, label in METRICS.items():
        stats = figures[name]
        row = {"metric": label, "count": stats.count}
        if stats.count:
            row |= {key: round(getattr(stats, key), 2) for key in ("p50", "p90", "p95", "p99",
                                                                   "max")}
        out.append(row)
    return out


CSV_SUFFIX = "_latency.csv"  # beside Locust's own files with --csv PREFIX


def latency_csv(figures: Mapping[str, Stats] | None) -> str:
    """The Latency (HDR) table as CSV: the figures Locust's own CSV files lack."""
    lines = [",".join(f'"{title}"' for title in COLUMNS.values())]
    for row in rows(figures) if figures is not None else []:
        lines.append(",".join([f'"{row["metric"]}"'] + [str(row.get(key, ""))
                                                         for key in list(COLUMNS)[1:]]))
    return "\n".join(lines) + "\n"


def write_latency_csv(csv_prefix: str | None, summary: Summary) -> None:
    """With Locust's --csv PREFIX, PREFIX_latency.csv beside its files."""
    if csv_prefix:
        Path(f"{csv_prefix}{CSV_SUFFIX}").write_text(latency_csv(ended(summary)))


def run_rows(written: tuple[Summary, Path] | None) -> list[dict]:
    """The last test that ended: where its results are, its headline figures, what to run next."""
    if written is None:
        return [{"item": "results", "value": "none yet: they appear here when a test stops"}]
    summary, path = written[0], str(written[1])
    r, t, m = summary.requests, summary.throughput, summary.metrics
    codes = ", ".join(f"{code} {n}" for code, n in r.failed_by_code.items())

    def p50_p99(name: str) -> str:
        stats = m.get(name)
        return (f"p50 {stats.p50:.1f} ms, p99 {stats.p99:.1f} ms" if stats and stats.count
                else "no samples")

    return [{"item": "run directory", "value": path},
            {"item": "requests", "value": f"sent {r.sent} = ok {r.ok} + failed {r.failed}"
                                          + (f" ({codes})" if codes else "")
                                          + (f" + cancelled {r.cancelled}" if r.cancelled
                                             else "")},
            {"item": "throughput", "value": f"{t.requests_per_s:.2f} requests/s, "
                                            f"{t.output_tokens_per_s:.1f} output tokens/s"},
            {"item": "TTFT", "value": p50_p99("ttft_ms")},
            {"item": "TPOT", "value": p50_p99("tpot_ms")},
            {"item": "report", "value": f"python -m analysis report {path}"}]
