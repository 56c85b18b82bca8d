"""The web UI's "Latency (HDR)" tab: TTFT, TPOT, ITL and end-to-end percentiles of the test
running in this process (or the last one), read live from its HDR histograms, the figures the
run directory will hold. Locust's own statistics table has one entry per request (its
end-to-end time), so its request rate and failure count are the run's; the latency that
matters for LLM serving is here. Built on Locust's extended tabs (its extend_web_ui example):
the tab's table and an `extended_stats` entry added to /stats/requests.

In a distributed run the master holds no histograms until the workers send them at the end:
the tab says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from flask import request

from loadgen.recorder import Recorder

TAB = "moe-latency"
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


def add_tab(environment, recorder: Callable[[], Recorder | None]) -> None:
    """The tab, where the web UI runs; recorder() gives the current (or last) test's."""
    web_ui = environment.web_ui
    if web_ui is None:
        return
    web_ui.template_args["extended_tabs"] = [{"title": "Latency (HDR)", "key": TAB}]
    web_ui.template_args["extended_tables"] = [
        {"key": TAB, "structure": [{"key": key, "title": title}
                                   for key, title in COLUMNS.items()]}]

    @web_ui.app.after_request
    def with_latency(response):
        if request.path != "/stats/requests" or not response.is_json:
            return response
        extended = [{"key": TAB, "data": rows(recorder())}]
        response.set_data(json.dumps({**response.json, "extended_stats": extended}))
        return response
