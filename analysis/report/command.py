"""`python -m analysis report RUN_DIR`: the figures, report.md, the text and the headline JSON
(its last line)."""

from __future__ import annotations

import argparse

from analysis.readers.files import RunDirError
from analysis.readers.rundir import load_run
from analysis.report.build import REPORT_MD, Report, figures
from analysis.report.markdown import render_markdown
from analysis.report.scraped import headline_figures
from analysis.report.text import render_text
from records.jsonform import dumps


def add_command(commands) -> None:
    parser = commands.add_parser(
        "report", help="percentile tables, plots and diagnosis of one run: report.md")
    parser.add_argument("run_dir", help="directory holding summary.json and histograms.json")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> None:
    run = load_run(args.run_dir)
    result = Report.of(run)
    try:
        for name, draw in figures(result).items():
            draw(run.path / name)
        (run.path / REPORT_MD).write_text(render_markdown(result))
    except OSError as e:  # the message names the file
        raise RunDirError(f"cannot write the report: {e}") from None
    print(render_text(result))
    print(f"\nreport: {run.path / REPORT_MD}")
    # Last line: machine-readable headline figures.
    print(dumps(headline(result)))


def headline(report: Report) -> dict:
    def latency(name: str, key: str) -> float | None:
        stats = report.latency[name]
        return round(getattr(stats, key), 3) if stats else None

    run = report.run
    throughput, requests, sla = run.summary.throughput, run.summary.requests, run.summary.sla
    if sla is not None:  # its probes' rates differ: no one load's percentiles
        return {"run_dir": str(run.path), "report_md": str(run.path / REPORT_MD),
                "sla_rps": sla.rate_rps, "sla_verdict": sla.verdict,
                "sla_failed_rps": sla.failed_rps, "sla_binding": sla.binding or None,
                "sla_fall": sla.fall or None, "ok": requests.ok, "failed": requests.failed,
                "diagnosis_fired": [f.rule for f in report.findings if f.fired]}
    return {"run_dir": str(run.path), "report_md": str(run.path / REPORT_MD),
            "ttft_p50_ms": latency("ttft", "p50"), "ttft_p99_ms": latency("ttft", "p99"),
            "tpot_p50_ms": latency("tpot", "p50"), "tpot_p99_ms": latency("tpot", "p99"),
            "e2e_p99_ms": latency("e2e", "p99"),
            "output_tokens_per_s": throughput.output_tokens_per_s,
            "requests_per_s": throughput.requests_per_s,
            "goodput_requests_per_s": throughput.goodput_requests_per_s,
            "ok": requests.ok, "failed": requests.failed,
            "server_metrics": (headline_figures(report.scraped, run) if report.scraped
                               else None),
            "diagnosis_fired": [f.rule for f in report.findings if f.fired]}
