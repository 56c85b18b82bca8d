"""The web UI's "Latency (HDR)" tab: TTFT, TPOT, ITL and end-to-end percentiles of the test
running in this process (or the last one), read live from its HDR histograms, the figures the
run directory will hold. Locust's own statistics table has one entry per request (its
end-to-end time), so its request rate and failure count are the run's; the latency that
matters for LLM serving is here. Built on Locust's extended tabs (its extend_web_ui example):
the tab's table and an `extended_stats` entry added to /stats/requests.

In a distributed run the master holds no histograms until the workers send them at the end:
the tab says so. The "Last run" tab shows, once a test stops, its run directory, headline
figures and the command that writes its report.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from flask import Response, request

from loadgen.recorder import Recorder
from records.summary import Summary

TAB, RUN_TAB = "moe-latency", "moe-run"
METRICS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL (per message)",
           "itl_token": "ITL (per token)", "e2e": "end-to-end", "send_lag": "send lag"}
COLUMNS = {"metric": "Metric", "count": "Requests or gaps", "p50": "p50 (ms)", "p90": "p90 (ms)",
           "p95": "p95 (ms)", "p99": "p99 (ms)", "max": "max (ms)"}


def rows(recorder: Recorder | None) -> list[dict]:
    if recorder is None:
        return [{"metric": "no test in this process yet (a distributed run's master shows the "
                           "figures in its report when the workers finish)"}]
    out = []
    for name, label in METRICS.items():
        stats = recorder.client[name].stats()
        row = {"metric": label, "count": stats.count}
        if stats.count:
            row |= {key: round(getattr(stats, key), 2) for key in ("p50", "p90", "p95", "p99",
                                                                   "max")}
        out.append(row)
    return out


CSV_ROUTE = "/moe/latency.csv"
CSV_SUFFIX = "_latency.csv"  # beside Locust's own files with --csv PREFIX


def latency_csv(recorder: Recorder | None) -> str:
    """The Latency (HDR) table as CSV: the figures Locust's own CSV files lack."""
    lines = [",".join(f'"{title}"' for title in COLUMNS.values())]
    for row in rows(recorder) if recorder is not None else []:
        lines.append(",".join([f'"{row["metric"]}"'] + [str(row.get(key, ""))
                                                         for key in list(COLUMNS)[1:]]))
    return "\n".join(lines) + "\n"


def write_latency_csv(csv_prefix: str | None, recorder: Recorder | None) -> None:
    """With Locust's --csv PREFIX, PREFIX_latency.csv beside its files."""
    if csv_prefix:
        Path(f"{csv_prefix}{CSV_SUFFIX}").write_text(latency_csv(recorder))


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


def add_tab(environment, recorder: Callable[[], Recorder | None],
            written: Callable[[], tuple[Summary, Path] | None]) -> None:
    """The tabs, where the web UI runs: recorder() gives the current (or last) test's
    histograms, written() the last finished test's summary and run directory."""
    web_ui = environment.web_ui
    if web_ui is None:
        return
    web_ui.template_args["extended_tabs"] = [{"title": "Latency (HDR)", "key": TAB},
                                             {"title": "Last run", "key": RUN_TAB}]
    web_ui.template_args["extended_tables"] = [
        {"key": TAB, "structure": [{"key": key, "title": title}
                                   for key, title in COLUMNS.items()]},
        {"key": RUN_TAB, "structure": [{"key": "item", "title": ""},
                                       {"key": "value", "title": ""}]}]
    web_ui.template_args["extended_csv_files"] = [
        {"href": CSV_ROUTE, "title": "Download TTFT, TPOT, ITL and end-to-end percentiles (HDR) "
                                     "as CSV"}]

    @web_ui.app.route(CSV_ROUTE)
    def latency_download():
        return Response(latency_csv(recorder()), mimetype="text/csv",
                        headers={"Content-Disposition": "attachment;filename=moe_latency.csv"})

    @web_ui.app.after_request
    def with_latency(response):
        if request.path != "/stats/requests" or not response.is_json:
            return response
        extended = [{"key": TAB, "data": rows(recorder())},
                    {"key": RUN_TAB, "data": run_rows(written())}]
        response.set_data(json.dumps({**response.json, "extended_stats": extended}))
        return response
