"""A run's report: the text for stdout, report.md, and the headline figures as one JSON object."""

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.breakdown import PARTS, TtftSplit, ttft_split
from analysis.diagnosis import render_markdown as diagnosis_markdown
from analysis.diagnosis import render_text as diagnosis_text
from analysis.diagnosis import rules
from analysis.finding import Finding
from analysis.latency import stats_ms
from analysis.plot import plot_latency_cdf
from analysis.plot_breakdown import plot_ttft_split
from analysis.plot_experts import plot_experts
from analysis.plot_stress import plot_stress
from analysis.plot_timeline import Phases, plot_over_time, plot_stages
from analysis.report_server import EXPERTS_PNG, STAGES_PNG, server_markdown, server_text
from analysis.rundir import Run, RunDirError, load_run
from analysis.samples import ServerSeries
from analysis.server_stats import ServerView, server_view
from analysis.spikes import read_signals
from analysis.tables import STAT_COLUMNS, fmt_ms, fmt_num, fmt_plain, markdown_table, stats_rows, text_table
from analysis.timeseries import ClientSeries, client_series

LATENCY_ROWS = ("ttft", "ttft_service", "tpot", "itl", "e2e", "e2e_service")
REPORT_MD = "report.md"
CDF_PNG = "latency_cdf.png"
SPLIT_PNG = "ttft_split.png"
OVER_TIME_PNG = "over_time.png"
STRESS_PNG = "stress.png"


@dataclass(frozen=True)
class Report:
    run: Run
    latency: dict[str, dict | None]  # LATENCY_ROWS name -> stats in ms, None without samples
    server: ServerView | None
    split: TtftSplit | None  # from requests.jsonl
    client: ClientSeries | None  # from the interval logs
    series: ServerSeries | None  # from server_stats.jsonl
    findings: list[Finding]  # the diagnosis rules, fired or not

    @classmethod
    def of(cls, run: Run) -> "Report":
        latency = {name: stats_ms(run.histograms.get(name)) for name in LATENCY_ROWS}
        signals = read_signals(run)  # each run file read once, shared with the diagnosis
        return cls(run, latency, server_view(run.section("server")), ttft_split(signals.rows),
                   client_series(run.path, rows=signals.rows), signals.series, rules(signals))


def figures(report: Report) -> dict[str, Callable[[Path], None]]:
    """PNG file name -> what draws it, for the figures this run has the data for."""
    run, drawn = report.run, {CDF_PNG: lambda path: plot_latency_cdf(report.run.histograms, path)}
    if report.split:
        drawn[SPLIT_PNG] = lambda path: plot_ttft_split(report.split, path)
    if report.client or report.series:
        config = run.section("config")
        phases = Phases(config.get("warmup_s") or 0.0, run.summary.get("duration_s"), config.get("mode") == "closed")
        drawn[OVER_TIME_PNG] = lambda path: plot_over_time(report.client, report.series, phases, path)
    if report.series and report.series.stage_ms:
        drawn[STAGES_PNG] = lambda path: plot_stages(report.series, path)
    if report.server and report.server.expert_tokens is not None:
        drawn[EXPERTS_PNG] = lambda path: plot_experts(report.server.expert_tokens, report.server.active_experts_steps,
                                                       path)
    if steps := run.section("stress").get("steps"):
        drawn[STRESS_PNG] = lambda path: plot_stress(steps, run.section("stress").get("knee_rps"), path)
    return drawn


def add_command(commands) -> None:
    parser = commands.add_parser("report", help="percentile tables, plots and diagnosis of one run: report.md")
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
    print(json.dumps(headline(result)))


def render_text(report: Report) -> str:
    run = report.run
    parts = [f"run {run.path}: {_window(run)}"]
    if config := run.section("config"):
        parts.append("config: " + " ".join(f"{key}={fmt_plain(value)}" for key, value in config.items()))
    parts.append(text_table(["latency (ms)", *STAT_COLUMNS.values()], stats_rows(report.latency)))
    if run.section("throughput"):
        parts.append("throughput: " + ", ".join(_throughput(run)))
    if run.section("requests"):
        parts.append(f"requests: {_accounting(run)}")
    if run.section("classes"):
        parts.append(text_table(CLASS_HEADER, _classes(run)))
    if run.section("stress"):
        parts.append(text_table(STEP_HEADER, _steps(run)) + "\n" + _knee(run))
    if server_time := run.section("server_time_ms"):
        parts.append(text_table(["server time (ms)", *STAT_COLUMNS.values()], stats_rows(server_time)))
    if report.split:
        parts.append(text_table(SPLIT_HEADER, _split_rows(report.split)))
    if report.server:
        parts.append("\n".join(server_text(report.server)))
    if generator := _generator(run):
        parts.append("\n".join(f"generator: {line}" for line in generator))
    parts.append(diagnosis_text(report.findings))
    return "\n\n".join(parts)


def render_markdown(report: Report) -> str:
    run = report.run
    parts = [f"# Run report: {run.path.resolve().name}", f"Run directory `{run.path}`; {_window(run)}."]
    if config := run.section("config"):
        rows = [[key, f"`{fmt_plain(value)}`"] for key, value in config.items()]
        parts += ["## Config", markdown_table(["setting", "value"], rows)]
    parts += ["## Latency (ms)", markdown_table(["metric", *STAT_COLUMNS.values()], stats_rows(report.latency)),
              "Percentiles decoded from the HDR histograms in histograms.json (3 significant digits).",
              f"![latency CDF]({CDF_PNG})"]
    if run.section("throughput"):
        parts += ["## Throughput", _bullets(_throughput(run))]
    if requests := run.section("requests"):
        row = [fmt_plain(requests.get(key)) for key in ("sent", "ok", "failed", "not_sent", "warmup")]
        parts += ["## Requests", markdown_table(["sent", "ok", "failed", "not sent", "warm-up"], [row])]
        if by_code := _by_count(requests.get("failed_by_code") or {}):
            parts.append("Failed by status code:\n\n" + _bullets(f"{code}: {n}" for code, n in by_code))
    if run.section("classes"):
        parts += ["## Request classes (ms)", markdown_table(CLASS_HEADER, _classes(run))]
    if run.section("stress"):
        parts += ["## Stress steps", markdown_table(STEP_HEADER, _steps(run)), _knee(run)]
        if run.section("stress").get("steps"):
            parts.append(f"![throughput-latency curve and goodput vs offered rate]({STRESS_PNG})")
    parts.append(diagnosis_markdown(report.findings).strip())
    if report.split:
        parts += ["## Where TTFT went (mean ms per request)", markdown_table(SPLIT_HEADER, _split_rows(report.split)),
                  "From requests.jsonl: generator lag = scheduled -> sent; server queue, prefill and TTFT from the "
                  "server's usage summary; network + client = (sent -> first token) - server TTFT.",
                  f"![TTFT split]({SPLIT_PNG})"]
    if report.client or report.series:
        parts += ["## Over time", _over_time_note(report), f"![over time]({OVER_TIME_PNG})"]
    if report.server or run.section("server_time_ms"):
        parts += ["## Server", *server_markdown(report.server, run.section("server_time_ms"),
                                                bool(report.series and report.series.stage_ms))]
    if generator := _generator(run):
        parts += ["## Generator", _bullets(generator)]
    return "\n\n".join(parts) + "\n"


def headline(report: Report) -> dict:
    def latency(name: str, key: str) -> float | None:
        stats = report.latency[name]
        return round(stats[key], 3) if stats else None

    run = report.run
    throughput, requests = run.section("throughput"), run.section("requests")
    return {"run_dir": str(run.path), "report_md": str(run.path / REPORT_MD),
            "ttft_p50_ms": latency("ttft", "p50"), "ttft_p99_ms": latency("ttft", "p99"),
            "tpot_p50_ms": latency("tpot", "p50"), "tpot_p99_ms": latency("tpot", "p99"),
            "e2e_p99_ms": latency("e2e", "p99"),
            "output_tokens_per_s": throughput.get("output_tokens_per_s"),
            "requests_per_s": throughput.get("requests_per_s"),
            "goodput_requests_per_s": throughput.get("goodput_requests_per_s"),
            "ok": requests.get("ok"), "failed": requests.get("failed"),
            "diagnosis_fired": [f.rule for f in report.findings if f.fired]}


def _window(run: Run) -> str:
    summary = run.summary
    window, duration = fmt_num(summary.get("window_s"), ".1f"), fmt_num(summary.get("duration_s"), ".1f")
    return f"started {fmt_plain(summary.get('started_at'))}, measured window {window} s of {duration} s"


def _throughput(run: Run) -> list[str]:
    throughput, config = run.section("throughput"), run.section("config")
    slos = [f"{name} ≤ {config[key]} ms" for name, key in (("TTFT", "slo_ttft_ms"), ("TPOT", "slo_tpot_ms"),
                                                            ("E2E", "slo_e2e_ms"))
            if config.get(key) is not None]
    lines = [f"{fmt_num(throughput.get('output_tokens_per_s'), '.1f')} output tokens/s",
             f"{fmt_num(throughput.get('requests_per_s'), '.2f')} requests/s",
             f"goodput {fmt_num(throughput.get('goodput_requests_per_s'), '.2f')} requests/s "
             f"({'SLO ' + ', '.join(slos) if slos else 'no SLO set'})"]
    share = run.section("slo").get("met_share") or {}
    if run.section("slo").get("objectives_ms") and share.get("all") is not None:
        lines.append("met: " + ", ".join(f"{name.upper() if name != 'all' else 'all'} {100 * v:.1f}%"
                                         for name, v in share.items() if v is not None))
    return lines


def _classes(run: Run) -> list[list[str]]:
    rows = []
    for name, c in run.section("classes").items():
        ttft, tpot = c.get("ttft_ms") or {}, c.get("tpot_ms") or {}
        rows.append([name, fmt_plain(c.get("sent")), fmt_plain(c.get("ok")), fmt_ms(ttft.get("p50")),
                     fmt_ms(ttft.get("p99")), fmt_ms(tpot.get("p50")), fmt_ms(tpot.get("p99"))])
    return rows


SPLIT_HEADER = ["TTFT band", "requests", *PARTS, "TTFT"]


def _split_rows(split: TtftSplit) -> list[list[str]]:
    return [[band, str(n), *(fmt_ms(float(ms)) for ms in means), fmt_ms(float(means.sum()))]
            for band, (n, means) in split.bands.items()]


def _over_time_note(report: Report) -> str:
    notes = []
    if report.client:
        width = float(np.median(report.client.length_s))
        notes.append(f"Client figures per {width:.3g} s window (interval logs, exact HDR adds), by when requests "
                     "finished; offered = requests scheduled per second.")
    if report.series:
        notes.append("Server figures between consecutive GetStats samples (server_stats.jsonl).")
    return " ".join(notes)


CLASS_HEADER = ["class", "sent", "ok", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99"]
STEP_HEADER = ["step", "offered/s", "sent/s", "achieved/s", "goodput/s", "TTFT p99", "TPOT p99", "saturated"]


def _steps(run: Run) -> list[list[str]]:
    rates = ("offered_rps", "sent_rps", "achieved_rps", "goodput_rps")
    return [[str(r["step"]), *(fmt_num(r[key], ".3g") for key in rates), fmt_ms(r["ttft_p99_ms"]),
             fmt_ms(r["tpot_p99_ms"]), r["saturated"] or "-"]
            for r in run.section("stress").get("steps", [])]


def _knee(run: Run) -> str:
    stress = run.section("stress")
    knee = stress.get("knee_rps")
    return (f"knee: {'none (the first step saturated)' if knee is None else f'{knee:g} requests/s'}; "
            f"stopped: {stress.get('stopped_because', '-')}")


def _accounting(run: Run) -> str:
    requests = run.section("requests")
    by_code = ", ".join(f"{code} {n}" for code, n in _by_count(requests.get("failed_by_code") or {}))
    return (f"sent {fmt_plain(requests.get('sent'))}, ok {fmt_plain(requests.get('ok'))}, "
            f"failed {fmt_plain(requests.get('failed'))}{f' ({by_code})' if by_code else ''}, "
            f"not sent {fmt_plain(requests.get('not_sent'))}, warm-up {fmt_plain(requests.get('warmup'))}")


def _generator(run: Run) -> list[str]:
    generator = run.section("generator")
    lines = []
    if "late_sends" in generator:
        lines.append(f"late sends {generator['late_sends']} (sent more than "
                     f"{fmt_num(generator.get('late_threshold_ms'), '.1f')} ms after their scheduled time)")
    for name, what in (("send_lag", "send lag (scheduled -> sent)"),
                       ("delivery_lag", "delivery lag (server emit -> client timestamp)")):
        lag = stats_ms(run.histograms.get(name))
        if lag:
            lines.append(f"{what} p50 {fmt_ms(lag['p50'])} ms, p99 {fmt_ms(lag['p99'])} ms, "
                         f"max {fmt_ms(lag['max'])} ms")
    if workers := run.summary.get("workers"):
        lines.append(f"{len(workers)} workers (interval logs in worker-<i>/): " + "; ".join(
            f"worker {w.get('worker')} sent {w.get('sent')}, CPU {fmt_num(w.get('cpu_percent'), '.0f')}%"
            for w in workers))
    return lines + [f"warning: {warning}" for warning in generator.get("warnings") or []]


def _by_count(counts: dict) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: -item[1])


def _bullets(lines) -> str:
    return "\n".join(f"- {line}" for line in lines)
