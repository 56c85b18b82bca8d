"""report.md, section by section, each shown where the run has something for it."""

from __future__ import annotations

from analysis.diagnosis import render_markdown as diagnosis_markdown
from analysis.readers.rundir import Run
from analysis.report.build import CDF_PNG, OVER_TIME_PNG, SPLIT_PNG, STRESS_PNG, Report
from analysis.report.scraped import scraped_markdown
from analysis.report.server import (
    prefix_over_time,
    server_markdown,
)
from analysis.report.sessions import sessions_markdown
from analysis.report.sla import MIXED_RATES, sla_markdown
from analysis.report.words import (
    CLASS_HEADER,
    SPLIT_HEADER,
    STEP_HEADER,
    answer,
    applying,
    bullets,
    by_count,
    class_rows,
    generator_lines,
    knee_line,
    over_time_note,
    split_rows,
    step_rows,
    throughput_lines,
    window_words,
)
from analysis.routing.section import (
    routing_markdown,
)
from analysis.rules.delivery import delivery_split
from analysis.rules.delivery import lines as delivery_lines
from analysis.rules.expert_parallel import lines as ep_lines
from analysis.slo_claims import (
    claims_lines,
    claims_markdown,
    conditions,
    final_word,
)
from analysis.tables import STAT_COLUMNS, fmt_plain, markdown_table, stats_rows


def render_markdown(report: Report) -> str:
    """report.md: each section that has something to show, in reading order."""
    run = report.run
    parts = [f"# Run report: {run.path.resolve().name}", answer(report),
             f"Run directory `{run.path}`; {window_words(run)}."]
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
    if report.run.summary.sla is not None:
        return ["## Latency (ms)", MIXED_RATES,
                "## Throughput", bullets(throughput_lines(report.run))]
    return ["## Latency (ms)",
            markdown_table(["metric", *STAT_COLUMNS.values()], stats_rows(report.latency)),
            "Percentiles decoded from the HDR histograms in histograms.json "
            "(3 significant digits).",
            f"![latency CDF]({CDF_PNG})",
            "## Throughput", bullets(throughput_lines(report.run))]


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
            bullets(claims_lines(report.claims, run.summary.requests.rows_omitted,
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
            "blocks an earlier prompt began with: what a prefix cache of 262,144 tokens "
            "could hit (`workload.prefix_share`)."]


def _requests_md(report: Report) -> list[str]:
    requests = report.run.summary.requests
    row = [str(n) for n in (requests.sent, requests.ok, requests.failed, requests.cancelled,
                            requests.not_sent, requests.warmup)]
    parts = ["## Requests", markdown_table(["sent", "ok", "failed", "cancelled by the client",
                                            "not sent", "warm-up"], [row])]
    if by_code := by_count(requests.failed_by_code):
        parts.append("Failed by status code:\n\n" + bullets(f"{code}: {n}" for code, n in by_code))
    return parts


def _mode_md(report: Report) -> list[str]:
    """What the run's mode adds: request classes, sessions, stress steps, the SLA search."""
    run, parts = report.run, []
    summary = run.summary
    if summary.classes:
        parts += ["## Request classes (ms)", markdown_table(CLASS_HEADER, class_rows(run))]
    if summary.sessions is not None:
        parts += ["## Sessions", *sessions_markdown(summary.sessions)]
    if summary.stress is not None:
        parts += ["## Stress steps", markdown_table(STEP_HEADER, step_rows(run)), knee_line(run)]
        if summary.stress.steps:
            parts.append(f"![throughput-latency curve and goodput vs offered rate]({STRESS_PNG})")
    if summary.sla is not None:
        parts += sla_markdown(summary.sla)
    return parts


def _diagnosis_md(report: Report) -> list[str]:
    parts = [diagnosis_markdown(report.findings).strip()]
    if report.split:
        parts += ["## Where TTFT went (mean ms per request)",
                  markdown_table(SPLIT_HEADER, split_rows(report.split)),
                  "From requests.jsonl: generator lag = scheduled -> sent; server queue, prefill "
                  "and TTFT from the server's usage summary; network + client = "
                  "(sent -> first token) - server TTFT.",
                  f"![TTFT split]({SPLIT_PNG})"]
    if report.client or report.series:
        parts += ["## Over time", over_time_note(report), f"![over time]({OVER_TIME_PNG})"]
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
    if generator := generator_lines(report.run):
        parts += ["## Generator", bullets(generator)]
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
