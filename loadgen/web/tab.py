"""The web UI's "Latency (HDR)" tab: TTFT, TPOT, ITL and end-to-end percentiles of the test
running in this process (or the last one), read live from its HDR histograms, the figures the
run directory will hold. Locust's own statistics table has one entry per request (its
end-to-end time), so its request rate and failure count are the run's; the latency that
matters for LLM serving is here. Built on Locust's extended tabs (its extend_web_ui example):
the tab's table and an `extended_stats` entry added to /stats/requests; under the table, a chart
of TTFT, TPOT and ITL over time (loadgen/web/timeline.py).

In a distributed run the master holds no histograms until the workers send them at the end:
the tab says so. The "Last run" tab shows, once a test stops, its run directory, headline
figures and the command that writes its report.

The page also loads loadgen/web/ui.js, which arranges the start form (loadgen/web/form.py) and
places the chart.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from flask import Response, request

from loadgen.recording.recorder import Recorder
from loadgen.web.form import form_spec
from loadgen.web.html_report import with_section
from loadgen.web.latency_table import COLUMNS, latency_csv, live, rows, run_rows
from loadgen.web.timeline import WIDTH, Timeline
from records.summary import Summary

TAB, RUN_TAB = "moe-latency", "moe-run"
CSV_ROUTE = "/moe/latency.csv"
CHART_ROUTE = "/moe/timeline.svg"
SCRIPT_ROUTE = "/moe/web_ui.js"
SCRIPT = Path(__file__).with_name("ui.js")
REFRESH_MS = 2000  # as often as Locust's own tables


def page_script(options: argparse.Namespace | None = None) -> str:
    """What the page loads before Locust's app: the form's arrangement (options: the command
    line's) and the chart's place, then loadgen/web/ui.js."""
    spec = {"form": form_spec(options), "tab": TAB, "chart": CHART_ROUTE, "refresh_ms": REFRESH_MS}
    data = json.dumps(spec).replace("</", "<\\/")  # nothing in it may close the script element
    return f'<script>window.moeWebUi = {data};</script><script src="{SCRIPT_ROUTE}"></script>'


# Locust's extension points in its page: our tabs, their tables' columns, the CSV download
TEMPLATE_ARGS = {
    "extended_tabs": [{"title": "Latency (HDR)", "key": TAB},
                      {"title": "Last run", "key": RUN_TAB}],
    "extended_tables": [
        {"key": TAB, "structure": [{"key": key, "title": title} for key, title in COLUMNS.items()]},
        {"key": RUN_TAB, "structure": [{"key": "item", "title": ""},
                                       {"key": "value", "title": ""}]}],
    "extended_csv_files": [
        {"href": CSV_ROUTE, "title": "Download TTFT, TPOT, ITL and end-to-end percentiles (HDR) "
                                     "as CSV"}]}


def add_tab(environment, recorder: Callable[[], Recorder | None],
            timeline: Callable[[], Timeline | None],
            written: Callable[[], tuple[Summary, Path] | None]) -> None:
    """The tabs, where the web UI runs: recorder() gives the current (or last) test's
    histograms, timeline() its periods so far, written() the last finished test's summary and
    run directory."""
    web_ui = environment.web_ui
    if web_ui is None:
        return
    web_ui.template_args.update(TEMPLATE_ARGS)

    @web_ui.app.route(CSV_ROUTE)
    def latency_download():
        return Response(latency_csv(live(recorder())), mimetype="text/csv",
                        headers={"Content-Disposition": "attachment;filename=moe_latency.csv"})

    @web_ui.app.route(CHART_ROUTE)
    def latency_chart():
        periods = timeline() or Timeline(environment.parsed_options.interval_s)
        width = request.args.get("w", type=int) or WIDTH  # the page's room for it
        return Response(periods.svg(width), mimetype="image/svg+xml",
                        headers={"Cache-Control": "no-store"})

    @web_ui.app.route(SCRIPT_ROUTE)
    def page_additions():
        return Response(SCRIPT.read_text(), mimetype="text/javascript")

    @web_ui.app.after_request
    def extended(response):
        endpoint = (request.endpoint or "").rpartition(".")[2]  # Locust's blueprint's name
        if endpoint == "index" and response.mimetype == "text/html":
            page = response.get_data(as_text=True)
            end = page.rfind("</body>")
            response.set_data(page[:end] + page_script(environment.parsed_options) + page[end:])
            return response
        if endpoint == "stats_report" and response.mimetype == "text/html" and written():
            response.set_data(with_section(response.get_data(as_text=True), *written(),
                                           timeline()))
            return response
        if request.path != "/stats/requests" or not response.is_json:
            return response
        extended = [{"key": TAB, "data": rows(live(recorder()))},
                    {"key": RUN_TAB, "data": run_rows(written())}]
        response.set_data(json.dumps({**response.json, "extended_stats": extended}))
        return response
