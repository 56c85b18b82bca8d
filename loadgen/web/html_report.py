"""What Locust's HTML report (--html FILE, and the web UI's report download) gains: a section
above Locust's own with the run's truthful figures: where its results are, requests by outcome,
throughput, the TTFT, TPOT, ITL and end-to-end percentiles from the HDR histograms (timed from
the scheduled send) and their chart over time. Locust's own tables count each request once, by
its end-to-end time; its report has no place for the rest, so the section is plain HTML put
before the report's app, and needs no script.
"""

from __future__ import annotations

import re
from html import escape
from pathlib import Path

from loadgen.web.latency_table import COLUMNS, ended, rows, run_rows
from loadgen.web.timeline import Timeline
from records.summary import Summary

STYLE = ("font-family:sans-serif;font-size:14px;max-width:1200px;margin:16px auto;"
         "padding:12px 16px;border:1px solid #ccc;border-radius:6px;background:#fff;color:#222")
BODY = re.compile(r"<body[^>]*>")
NO_CHART = ("The chart over time is drawn by the process that ran the schedule; a distributed "
            "run's workers keep theirs in their interval logs (python -m analysis report draws "
            "the whole run).")


def section(summary: Summary, run_dir: Path, timeline: Timeline | None) -> str:
    """The figures of the run written to run_dir, as an HTML section."""
    facts = "".join(f"<tr><th style='text-align:left;padding-right:12px'>{escape(r['item'])}"
                    f"</th><td>{escape(r['value'])}</td></tr>"
                    for r in run_rows((summary, run_dir)))
    head = "".join(f"<th style='text-align:left;padding:2px 10px'>{escape(t)}</th>"
                   for t in COLUMNS.values())
    body = "".join("<tr>" + "".join(f"<td style='padding:2px 10px'>{escape(str(r.get(k, '')))}"
                                    "</td>" for k in COLUMNS) + "</tr>"
                   for r in rows(ended(summary)))
    chart = timeline.svg() if timeline is not None else f"<p>{escape(NO_CHART)}</p>"
    return (f"<section id='moe-loadlab' style='{STYLE}'>"
            "<h2 style='margin:4px 0 8px'>moe-loadlab: the run</h2>"
            f"<table>{facts}</table>"
            "<h3 style='margin:12px 0 4px'>Latency from the HDR histograms, timed from each "
            "request's scheduled send (Locust's tables below count each request once, by its "
            "end-to-end time)</h3>"
            f"<table style='border-collapse:collapse'><tr>{head}</tr>{body}</table>"
            f"<h3 style='margin:12px 0 4px'>Over time</h3>{chart}</section>")


def with_section(page: str, summary: Summary, run_dir: Path, timeline: Timeline | None) -> str:
    """Locust's report page with the section at the top of its body (the page's script, in its
    head, holds tags of its own)."""
    body = BODY.search(page, max(page.rfind("</head>"), 0))
    if body is None:
        return page
    return page[:body.end()] + section(summary, run_dir, timeline) + page[body.end():]


def add_to_report(path: Path, summary: Summary, run_dir: Path, timeline: Timeline | None) -> None:
    """The section written into the report file Locust wrote."""
    path.write_text(with_section(path.read_text(encoding="utf-8"), summary, run_dir, timeline),
                    encoding="utf-8")
