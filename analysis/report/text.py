"""The report for stdout."""

from __future__ import annotations

from analysis.diagnosis import render_text as diagnosis_text
from analysis.report.build import Report
from analysis.report.scraped import scraped_text
from analysis.report.server import (
    server_text,
)
from analysis.report.sessions import sessions_text
from analysis.report.sla import MIXED_RATES, sla_text, sla_verdict
from analysis.report.words import (
    CLASS_HEADER,
    SPLIT_HEADER,
    STEP_HEADER,
    accounting_line,
    answer,
    applying,
    class_rows,
    generator_lines,
    knee_line,
    split_rows,
    step_rows,
    throughput_lines,
    window_words,
)
from analysis.routing.section import (
    routing_lines,
)
from analysis.rules.delivery import delivery_split
from analysis.rules.delivery import lines as delivery_lines
from analysis.rules.expert_parallel import lines as ep_lines
from analysis.slo_claims import (
    claims_lines,
    conditions,
    final_word,
)
from analysis.tables import STAT_COLUMNS, fmt_ms, fmt_plain, stats_rows, text_table
from records.summary import Summary


def asked_lines(summary: Summary) -> list[str]:
    """What the requests reasoned, and what the workload asked, where the run has them."""
    lines = []
    if (r := summary.reasoning) is not None:
        lines.append(f"reasoning: {r.requests} requests, {r.reasoning_tokens} reasoning + "
                     f"{r.answer_tokens} answer tokens, first reasoning token p50 "
                     f"{fmt_ms(r.ttfr_ms.p50)} ms, first answer token p50 "
                     f"{fmt_ms(r.ttfa_ms.p50)} ms, {r.no_answer} with no answer")
    if (w := summary.workload) is not None:
        lines.append(f"workload: {w.requests} requests, prompt tokens mean "
                     f"{w.prompt_tokens.mean:.1f} p50 {w.prompt_tokens.p50} p99 "
                     f"{w.prompt_tokens.p99} max {w.prompt_tokens.max}, output tokens asked mean "
                     f"{w.max_tokens.mean:.1f} max {w.max_tokens.max}, prefix share "
                     f"{100 * w.prefix_share:.1f}%")
    return lines


def render_text(report: Report) -> str:
    run = report.run
    summary = run.summary
    parts = [f"run {run.path}: {window_words(run)}", answer(report),
             "config: " + " ".join(f"{key}={fmt_plain(value)}"
                                   for key, value in applying(summary.config).items()),
             (MIXED_RATES if summary.sla is not None else
              text_table(["latency (ms)", *STAT_COLUMNS.values()], stats_rows(report.latency))),
             "throughput: " + ", ".join(throughput_lines(run)), f"requests: {accounting_line(run)}"]
    parts += asked_lines(summary)
    if summary.classes:
        parts.append(text_table(CLASS_HEADER, class_rows(run)))
    if summary.sessions is not None:
        parts.append(sessions_text(summary.sessions))
    if summary.stress is not None:
        parts.append(text_table(STEP_HEADER, step_rows(run)) + "\n" + knee_line(run))
    if summary.sla is not None:
        parts.append(sla_text(summary.sla))
    if server_time := summary.server_time_ms:
        parts.append(text_table(["server time (ms)", *STAT_COLUMNS.values()],
                                stats_rows(server_time)))
    if report.split:
        parts.append(text_table(SPLIT_HEADER, split_rows(report.split)))
    if report.server:
        parts.append("\n".join(server_text(report.server)))
    if report.scraped:
        parts.append("\n".join(scraped_text(report.scraped, run)))
    if report.ep:
        parts.append("\n".join(f"expert parallel: {label}: {value}"
                               for label, value in ep_lines(report.ep)))
    if report.routing:
        parts.append("\n".join(f"routing: {line}" for line in routing_lines(report.routing)))
    if generator := generator_lines(run):
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
