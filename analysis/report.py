"""A run's report: the text for stdout, report.md, and the headline figures as one JSON object."""

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.diagnosis import render_markdown as diagnosis_markdown
from analysis.diagnosis import render_text as diagnosis_text
from analysis.diagnosis import rules
from analysis.plots.cdf import plot_latency_cdf
from analysis.plots.experts import plot_experts
from analysis.plots.sla import plot_sla
from analysis.plots.stress import plot_stress
from analysis.plots.timeline import Imbalance, Phases, plot_over_time, plot_stages
from analysis.plots.ttft_split import plot_ttft_split
from analysis.readers.files import RunDirError
from analysis.readers.latency import stats_ms
from analysis.readers.rundir import Run, load_run
from analysis.readers.samples import ServerSeries
from analysis.readers.server_metrics import ServerSide
from analysis.readers.server_stats import ServerView, server_view
from analysis.readers.timeseries import ClientSeries, client_series
from analysis.report_scraped import headline_figures, scraped_markdown, scraped_text
from analysis.report_server import (
    EXPERTS_PNG,
    STAGES_PNG,
    prefix_over_time,
    server_markdown,
    server_text,
)
from analysis.report_sessions import sessions_markdown, sessions_text
from analysis.report_sla import SLA_PNG, found, sla_markdown, sla_text, sla_verdict
from analysis.routing.section import (
    ROUTING_PNG,
    RoutingReport,
    draw_routing,
    routing_lines,
    routing_markdown,
    routing_report,
)
from analysis.rules.delivery import delivery_split
from analysis.rules.delivery import lines as delivery_lines
from analysis.rules.expert_parallel import EpView, ep_view
from analysis.rules.expert_parallel import lines as ep_lines
from analysis.rules.finding import Finding
from analysis.rules.spikes import signals_of
from analysis.slo_claims import (
    Claim,
    claims,
    claims_lines,
    claims_markdown,
    conditions,
    final_word,
)
from analysis.tables import STAT_COLUMNS, fmt_ms, fmt_plain, markdown_table, stats_rows, text_table
from analysis.ttft_split import PARTS, TtftSplit, ttft_split
from records.declare import applies, flat, leaves
from records.jsonform import dumps
from records.load_settings import LoadSettings
from records.summary import Stats

LATENCY_ROWS = ("ttft", "ttft_service", "tpot", "itl", "itl_token", "e2e", "e2e_service")
REPORT_MD = "report.md"
CDF_PNG = "latency_cdf.png"
SPLIT_PNG = "ttft_split.png"
OVER_TIME_PNG = "over_time.png"
STRESS_PNG = "stress.png"


@dataclass(frozen=True)
class Report:
    run: Run
    latency: dict[str, Stats | None]  # LATENCY_ROWS name -> stats in ms, None without samples
    server: ServerView | None
    split: TtftSplit | None  # from requests.jsonl
    client: ClientSeries | None  # from the interval logs
    series: ServerSeries | None  # from server_stats.jsonl
    findings: list[Finding]  # the diagnosis rules, fired or not
    imbalance: Imbalance | None = None  # what the diagnosis judged, for the over-time figure
    ep: EpView | None = None  # the exchanges between expert-parallel ranks (--ep)
    scraped: ServerSide | None = None  # from server_metrics.jsonl
    routing: RoutingReport | None = None  # routed_experts.jsonl, the engines' expert records
    claims: list[Claim] = dataclasses.field(default_factory=list)  # the objectives, judged

    @classmethod
    def of(cls, run: Run) -> "Report":
        latency = {name: stats_ms(run.histograms.get(name)) for name in LATENCY_ROWS}
        signals = signals_of(run)  # shared with the diagnosis
        view = server_view(run.summary.server)
        tokens = view.expert_tokens if view is not None else None
        run_wide = (float((tokens.max(axis=1) / tokens.mean(axis=1)).max())
                    if tokens is not None and tokens.mean() > 0 else None)
        return cls(run, latency, view, ttft_split(run.rows), client_series(run), signals.series,
                   rules(signals), Imbalance(signals.imbalance, run_wide),
                   ep_view(run.summary.server), signals.scraped, routing_report(run),
                   claims(run))


def figures(report: Report) -> dict[str, Callable[[Path], None]]:
    """PNG file name -> what draws it, for the figures this run has the data for."""
    run, drawn = report.run, {CDF_PNG: lambda path: plot_latency_cdf(report.run.histograms, path)}
    if report.split:
        drawn[SPLIT_PNG] = lambda path: plot_ttft_split(report.split, path)
    if report.client or report.series:
        config = run.summary.config
        phases = Phases(config.recording.warmup_s, run.summary.duration_s,
                        config.traffic.mode == "closed")
        drawn[OVER_TIME_PNG] = lambda path: plot_over_time(report.client, report.series, phases,
                                                           path, report.imbalance)
    if report.series and report.series.stage_ms:
        drawn[STAGES_PNG] = lambda path: plot_stages(report.series, path)
    if report.server and report.server.expert_tokens is not None:
        drawn[EXPERTS_PNG] = lambda path: plot_experts(report.server.expert_tokens,
                                                       report.server.active_experts_steps, path)
    if report.routing is not None and report.routing.view is not None:
        drawn[ROUTING_PNG] = lambda path: draw_routing(report.routing, path)
    stress = run.summary.stress
    if stress is not None and stress.steps:
        drawn[STRESS_PNG] = lambda path: plot_stress(stress.steps, stress.knee_rps, path)
    if (sla := run.summary.sla) is not None and sla.probes:
        drawn[SLA_PNG] = lambda path: plot_sla(sla, path)
    return drawn


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


def render_text(report: Report) -> str:
    run = report.run
    summary = run.summary
    parts = [f"run {run.path}: {_window(run)}", answer(report),
             "config: " + " ".join(f"{key}={fmt_plain(value)}"
                                   for key, value in applying(summary.config).items()),
             text_table(["latency (ms)", *STAT_COLUMNS.values()], stats_rows(report.latency)),
             "throughput: " + ", ".join(_throughput(run)), f"requests: {_accounting(run)}"]
    if (r := summary.reasoning) is not None:
        parts.append(f"reasoning: {r.requests} requests, {r.reasoning_tokens} reasoning + "
                     f"{r.answer_tokens} answer tokens, first reasoning token p50 "
                     f"{fmt_ms(r.ttfr_ms.p50)} ms, first answer token p50 "
                     f"{fmt_ms(r.ttfa_ms.p50)} ms, {r.no_answer} with no answer")
    if (w := summary.workload) is not None:
        parts.append(f"workload: {w.requests} requests, prompt tokens mean "
                     f"{w.prompt_tokens.mean:.1f} p50 {w.prompt_tokens.p50} p99 "
                     f"{w.prompt_tokens.p99} max {w.prompt_tokens.max}, output tokens asked mean "
                     f"{w.max_tokens.mean:.1f} max {w.max_tokens.max}, prefix share "
                     f"{100 * w.prefix_share:.1f}%")
    if summary.classes:
        parts.append(text_table(CLASS_HEADER, _classes(run)))
    if summary.sessions is not None:
        parts.append(sessions_text(summary.sessions))
    if summary.stress is not None:
        parts.append(text_table(STEP_HEADER, _steps(run)) + "\n" + _knee(run))
    if summary.sla is not None:
        parts.append(sla_text(summary.sla))
    if server_time := summary.server_time_ms:
        parts.append(text_table(["server time (ms)", *STAT_COLUMNS.values()],
                                stats_rows(server_time)))
    if report.split:
        parts.append(text_table(SPLIT_HEADER, _split_rows(report.split)))
    if report.server:
        parts.append("\n".join(server_text(report.server)))
    if report.scraped:
        parts.append("\n".join(scraped_text(report.scraped, run)))
    if report.ep:
        parts.append("\n".join(f"expert parallel: {label}: {value}"
                               for label, value in ep_lines(report.ep)))
    if report.routing:
        parts.append("\n".join(f"routing: {line}" for line in routing_lines(report.routing)))
    if generator := _generator(run):
        parts.append("\n".join(f"generator: {line}" for line in generator))
    if split := delivery_split(run):
        parts.append("\n".join(f"who is late: {line}" for line in delivery_lines(split)))
    parts.append(diagnosis_text(report.findings))
    if report.claims:  # the last word: the objectives' verdict
        parts.append("\n".join(claims_lines(report.claims, run.summary.requests.rows_omitted,
                                            conditions(run)))
                     + "\n" + final_word(run, report.claims))
    elif run.summary.sla is not None:
        parts.append(sla_verdict(run.summary.sla))
    return "\n\n".join(parts)


def render_markdown(report: Report) -> str:
    """report.md: each section that has something to show, in reading order."""
    run = report.run
    parts = [f"# Run report: {run.path.resolve().name}", answer(report),
             f"Run directory `{run.path}`; {_window(run)}."]
    for section in (_config_md, _latency_md, _objectives_md, _reasoning_md, _workload_md,
                    _requests_md, _mode_md, _diagnosis_md, _server_md, _generator_md):
        parts += section(report)
    return "\n\n".join(parts) + "\n"


def _config_md(report: Report) -> list[str]:
    rows = [[key, f"`{fmt_plain(value)}`"]
            for key, value in applying(report.run.summary.config).items()]
    return ["## Config", "The settings that apply to this run's mode, arrivals and target.",
            markdown_table(["setting", "value"], rows)]


def _latency_md(report: Report) -> list[str]:
    return ["## Latency (ms)",
            markdown_table(["metric", *STAT_COLUMNS.values()], stats_rows(report.latency)),
            "Percentiles decoded from the HDR histograms in histograms.json "
            "(3 significant digits).",
            f"![latency CDF]({CDF_PNG})",
            "## Throughput", _bullets(_throughput(report.run))]


def _objectives_md(report: Report) -> list[str]:
    if not report.claims:
        return []
    run = report.run
    return [f"## Objectives: {final_word(run, report.claims).removeprefix('verdict: ')}",
            "Each objective as a percentile claim, judged as MLPerf Inference's server "
            "scenario judges one: the percentile against its bound, and whether the "
            "requests support it at 99% confidence (its early-stopping rule), with the "
            "percentile's exact interval from the order statistics (docs/metrics.md).",
            claims_markdown(report.claims),
            _bullets(claims_lines(report.claims, run.summary.requests.rows_omitted,
                                  conditions(run)))]


def _reasoning_md(report: Report) -> list[str]:
    if (r := report.run.summary.reasoning) is None:
        return []
    parts = ["## Reasoning",
             f"{r.requests} measured requests reasoned: {r.reasoning_tokens} reasoning and "
             f"{r.answer_tokens} answer tokens. TTFT is the first token of either kind; "
             "the times to the first reasoning and the first answer token (ms from the "
             "scheduled send):",
             markdown_table(["metric", *STAT_COLUMNS.values()],
                            stats_rows({"first reasoning token": r.ttfr_ms,
                                        "first answer token": r.ttfa_ms}))]
    if r.no_answer:
        parts.append(f"**{r.no_answer} of them spent every token asked on reasoning, "
                     "with no answer**: raise `--max-tokens`.")
    return parts


def _workload_md(report: Report) -> list[str]:
    workload = report.run.summary.workload
    if workload is None:
        return []
    return ["## Workload offered",
            markdown_table(["", "mean", "p50", "p90", "p99", "max"], _workload_rows(report.run)),
            f"{workload.requests} requests sent; their prompts shared "
            f"{100 * workload.prefix_share:.1f}% of their tokens by 16-token "
            "blocks an earlier prompt began with: what an unbounded prefix cache could "
            "hit (`workload.prefix_share`)."]


def _requests_md(report: Report) -> list[str]:
    requests = report.run.summary.requests
    row = [str(n) for n in (requests.sent, requests.ok, requests.failed, requests.cancelled,
                            requests.not_sent, requests.warmup)]
    parts = ["## Requests", markdown_table(["sent", "ok", "failed", "cancelled by the client",
                                            "not sent", "warm-up"], [row])]
    if by_code := _by_count(requests.failed_by_code):
        parts.append("Failed by status code:\n\n" + _bullets(f"{code}: {n}" for code, n in by_code))
    return parts


def _mode_md(report: Report) -> list[str]:
    """What the run's mode adds: request classes, sessions, stress steps, the SLA search."""
    run, parts = report.run, []
    summary = run.summary
    if summary.classes:
        parts += ["## Request classes (ms)", markdown_table(CLASS_HEADER, _classes(run))]
    if summary.sessions is not None:
        parts += ["## Sessions", *sessions_markdown(summary.sessions)]
    if summary.stress is not None:
        parts += ["## Stress steps", markdown_table(STEP_HEADER, _steps(run)), _knee(run)]
        if summary.stress.steps:
            parts.append(f"![throughput-latency curve and goodput vs offered rate]({STRESS_PNG})")
    if summary.sla is not None:
        parts += sla_markdown(summary.sla)
    return parts


def _diagnosis_md(report: Report) -> list[str]:
    parts = [diagnosis_markdown(report.findings).strip()]
    if report.split:
        parts += ["## Where TTFT went (mean ms per request)",
                  markdown_table(SPLIT_HEADER, _split_rows(report.split)),
                  "From requests.jsonl: generator lag = scheduled -> sent; server queue, prefill "
                  "and TTFT from the server's usage summary; network + client = "
                  "(sent -> first token) - server TTFT.",
                  f"![TTFT split]({SPLIT_PNG})"]
    if report.client or report.series:
        parts += ["## Over time", _over_time_note(report), f"![over time]({OVER_TIME_PNG})"]
    return parts


def _server_md(report: Report) -> list[str]:
    """The server's side: its telemetry, its prefix cache over time, its scraped metrics, its
    expert-parallel exchanges and the routed experts."""
    summary, parts = report.run.summary, []
    if report.server or summary.server_time_ms:
        parts += ["## Server", *server_markdown(report.server, summary.server_time_ms,
                                                bool(report.series and report.series.stage_ms))]
    if prefix := prefix_over_time(report.series, report.client):
        parts += ["### Prefix-cache hit rate over time, beside the client's TTFT",
                  markdown_table(["run s", "prompt tokens queried", "hit rate",
                                  "client TTFT p50 (ms)"], prefix)]
    if report.scraped:
        parts += ["## Server metrics (scraped)",
                  *scraped_markdown(report.scraped, report.run, report.client)]
    if report.ep:
        parts += ["## Expert parallelism",
                  "Bytes counted by the server from the actual routing (hidden states to another "
                  "rank's experts and back); beside them the usual formula's volume. Exposed: "
                  "the part of the exchanges' time the steps waited for.",
                  markdown_table(["figure", "value"], [list(r) for r in ep_lines(report.ep)])]
    if report.routing:
        parts += routing_markdown(report.routing)
    return parts


def _generator_md(report: Report) -> list[str]:
    parts = []
    if generator := _generator(report.run):
        parts += ["## Generator", _bullets(generator)]
    if split := delivery_split(report.run):
        first, *rest = delivery_lines(split)
        parts += ["### Who is late: the delivery lag in three parts", first, "\n".join(rest)]
    return parts


def _workload_rows(run: Run) -> list[list[str]]:
    w = run.summary.workload
    return [[name, f"{lengths.mean:.1f}", *(str(getattr(lengths, k)) for k in
                                             ("p50", "p90", "p99", "max"))]
            for name, lengths in (("prompt tokens", w.prompt_tokens),
                                  ("output tokens asked", w.max_tokens))]


def headline(report: Report) -> dict:
    def latency(name: str, key: str) -> float | None:
        stats = report.latency[name]
        return round(getattr(stats, key), 3) if stats else None

    run = report.run
    throughput, requests = run.summary.throughput, run.summary.requests
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


UNSET = ("", None, ())  # an optional setting's value where it is not given


def applying(config: LoadSettings) -> dict:
    """The run's settings that apply to its mode, arrivals and target (each setting's `when` in
    records/load_settings.py), by name; an optional one left unset (empty by default: no TLS
    file, no token, no dataset) is not listed."""
    values = flat(config)
    return {leaf.name: values[leaf.name] for leaf in leaves(LoadSettings)
            if applies(leaf, config)
            and not (values[leaf.name] in UNSET and leaf.default in UNSET)}


def answer(report: Report) -> str:
    """The run in one paragraph: what was offered and achieved, the latencies that matter,
    what failed and which diagnoses fired."""
    run = report.run
    summary, config = run.summary, run.summary.config
    traffic, r, t = config.traffic, summary.requests, summary.throughput
    if traffic.mode == "closed":
        offered = "A closed loop (each user sends when its last request ends)"
    elif summary.stress is not None:
        knee = summary.stress.knee_rps
        offered = (f"A stress run from {traffic.rate:g} requests/s: "
                   + ("no step held" if knee is None else f"the knee is {knee:g} requests/s"))
    elif summary.sla is not None:
        offered = f"An SLA search from {traffic.rate:g} requests/s: {found(summary.sla)}"
    elif traffic.trace:
        offered = f"Replayed the trace {Path(traffic.trace).name}" + _trace_load(summary)
    else:
        unit = "sessions/s" if traffic.mode == "sessions" else "requests/s"
        offered = f"Offered {traffic.rate:g} {unit} ({traffic.mode}, {traffic.arrival})"
    parts = [f"{offered} to the {config.target.target} server at {config.sender.host}, "
             f"measured over {summary.window_s:.0f} s: achieved {t.requests_per_s:.2f} "
             f"requests/s and {t.output_tokens_per_s:.1f} output tokens/s."]
    if draw := _poisson_draw(summary):
        parts.append(draw)
    latency = [f"{name} p50 {fmt_ms(stats.p50)} ms, p99 {fmt_ms(stats.p99)} ms"
               for name, stats in (("TTFT", report.latency.get("ttft")),
                                   ("TPOT", report.latency.get("tpot")))
               if stats is not None and stats.count]
    if latency:
        parts.append("; ".join(latency) + ".")
    codes = ", ".join(f"{code} {n}" for code, n in _by_count(r.failed_by_code))
    parts.append(f"{r.ok} of {r.sent} requests ok" + (f", {r.failed} failed ({codes})"
                                                      if r.failed else "")
                 + (f", {r.cancelled} cancelled by the client" if r.cancelled else "") + ".")
    fired = [f.title for f in report.findings if f.fired]
    parts.append("Diagnosis: " + ("; ".join(fired) if fired else "no rule fired") + ".")
    return " ".join(parts)


def _trace_load(summary) -> str:
    """The load a replayed trace offered: its requests over the run (and its speed-up)."""
    traffic = summary.config.traffic
    if summary.workload is None or summary.duration_s <= 0:
        return ""
    n = summary.workload.requests
    faster = f", {traffic.trace_speedup:g}x its speed" if traffic.trace_speedup != 1 else ""
    return (f" ({n} requests over {summary.duration_s:.0f} s, "
            f"{n / summary.duration_s:.2f} requests/s offered{faster})")


POISSON_NOTED = 0.05  # a draw this far (as a share) from the rate's expectation is explained


def _poisson_draw(summary) -> str:
    """Where Poisson arrivals scheduled notably more or fewer requests in the window than the
    rate makes them on average: the draw and its usual range, so an achieved rate below the
    offered one is not read as the server falling short."""
    traffic, r = summary.config.traffic, summary.requests
    if (traffic.arrival != "poisson" or traffic.trace or traffic.mode != "fixed"
            or summary.window_s <= 0):
        return ""
    expected = traffic.rate * summary.window_s
    scheduled = r.sent + r.not_sent
    if expected <= 0 or abs(scheduled - expected) <= POISSON_NOTED * expected:
        return ""
    spread = 1.96 * expected ** 0.5
    return (f"The Poisson arrivals scheduled {scheduled} requests in the window, where the rate "
            f"makes {expected:.0f} on average (95% of draws {max(0, expected - spread):.0f}-"
            f"{expected + spread:.0f}): the achieved rate follows the draw, not the rate.")


def _window(run: Run) -> str:
    summary = run.summary
    return (f"started {summary.started_at}, measured window {summary.window_s:.1f} s of "
            f"{summary.duration_s:.1f} s")


def _throughput(run: Run) -> list[str]:
    throughput, slo = run.summary.throughput, run.summary.config.slo
    objectives = (("TTFT", slo.slo_ttft_ms), ("TPOT", slo.slo_tpot_ms), ("E2E", slo.slo_e2e_ms))
    slos = [f"{name} ≤ {ms:g} ms" for name, ms in objectives if ms is not None]
    lines = [f"{throughput.output_tokens_per_s:.1f} output tokens/s",
             f"{throughput.requests_per_s:.2f} requests/s",
             f"goodput {throughput.goodput_requests_per_s:.2f} requests/s "
             f"({'SLO ' + ', '.join(slos) if slos else 'no SLO set'})"]
    share = run.summary.slo.met_share
    if run.summary.slo.objectives_ms and share.get("all") is not None:
        lines.append("met: " + ", ".join(
            f"{name.upper() if name != 'all' else 'all'} {100 * v:.1f}%"
            for name, v in share.items() if v is not None))
    return lines


def _classes(run: Run) -> list[list[str]]:
    return [[name, str(c.sent), str(c.ok), fmt_ms(c.ttft_ms.p50), fmt_ms(c.ttft_ms.p99),
             fmt_ms(c.tpot_ms.p50), fmt_ms(c.tpot_ms.p99)]
            for name, c in run.summary.classes.items()]


SPLIT_HEADER = ["TTFT band", "requests", *PARTS, "TTFT"]


def _split_rows(split: TtftSplit) -> list[list[str]]:
    return [[band, str(n), *(fmt_ms(float(ms)) for ms in means), fmt_ms(float(means.sum()))]
            for band, (n, means) in split.bands.items()]


def _over_time_note(report: Report) -> str:
    notes = []
    if report.client:
        width = float(np.median(report.client.length_s))
        notes.append(f"Client figures per {width:.3g} s window (interval logs, exact HDR adds), "
                     "by when requests finished; offered = requests scheduled per second.")
    if report.series:
        notes.append("Server figures between consecutive GetStats samples (server_stats.jsonl).")
    return " ".join(notes)


CLASS_HEADER = ["class", "sent", "ok", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99"]
STEP_HEADER = ["step", "offered/s", "sent/s", "achieved/s", "goodput/s", "TTFT p99", "TPOT p99",
               "saturated"]


def _steps(run: Run) -> list[list[str]]:
    return [[str(r.step), *(f"{rate:.3g}"
                            for rate in (r.offered_rps, r.sent_rps, r.achieved_rps, r.goodput_rps)),
             fmt_ms(r.ttft_p99_ms), fmt_ms(r.tpot_p99_ms), r.saturated or "-"]
            for r in run.summary.stress.steps]


def _knee(run: Run) -> str:
    stress = run.summary.stress
    knee = stress.knee_rps
    return (f"knee: "
            f"{'none (the first step saturated)' if knee is None else f'{knee:g} requests/s'}; "
            f"stopped: {stress.stopped_because or '-'}")


def _accounting(run: Run) -> str:
    requests = run.summary.requests
    by_code = ", ".join(f"{code} {n}" for code, n in _by_count(requests.failed_by_code))
    return (f"sent {requests.sent}, ok {requests.ok}, failed {requests.failed}"
            f"{f' ({by_code})' if by_code else ''}, "
            f"{f'cancelled by the client {requests.cancelled}, ' if requests.cancelled else ''}"
            f"not sent {requests.not_sent}, warm-up {requests.warmup}")


def _generator(run: Run) -> list[str]:
    generator = run.summary.generator
    sender = f"{generator.client} sender, " if generator.client else ""
    lines = [f"{sender}late sends {generator.late_sends} (sent more than "
             f"{generator.late_threshold_ms:.1f} ms after their scheduled time)"]
    for name, what in (("send_lag", "send lag (scheduled -> sent)"),
                       ("loop_lag", "loop lag (the generator's event loop woke late)"),
                       ("delivery_lag", "delivery lag (server emit -> client timestamp)")):
        lag = stats_ms(run.histograms.get(name))
        if lag:
            lines.append(f"{what} p50 {fmt_ms(lag.p50)} ms, p99 {fmt_ms(lag.p99)} ms, "
                         f"max {fmt_ms(lag.max)} ms")
    if workers := run.summary.workers:
        lines.append(f"{len(workers)} workers (interval logs in worker-<i>/): " + "; ".join(
            f"worker {w.worker} sent {w.sent}, CPU {w.cpu_percent:.0f}%" for w in workers))
    return (lines + [f"note: {note}" for note in generator.notes]
            + [f"warning: {warning}" for warning in generator.warnings])


def _by_count(counts: dict) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: -item[1])


def _bullets(lines) -> str:
    return "\n".join(f"- {line}" for line in lines)
