"""What the text and markdown reports both say: the answer that opens them, the settings that
apply, the run's window, throughput, classes, stress steps, TTFT split and generator."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from analysis.readers.latency import stats_ms
from analysis.readers.rundir import Run
from analysis.report.build import Report
from analysis.report.sla import found
from analysis.tables import fmt_ms
from analysis.ttft_split import PARTS, TtftSplit
from records.declare import applies, flat, leaves
from records.load_settings import LoadSettings
from records.load_settings.choices import Mode

UNSET = ("", None, ())  # an optional setting's value where it is not given


def applying(config: LoadSettings) -> dict:
    """The run's settings that apply to its mode, arrivals and target (each setting's `when` in
    records/load_settings/), by name; an optional one left unset (empty by default: no TLS
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
    if not Mode(traffic.mode).open_loop:
        offered = "A closed loop (each user sends when its last request ends)"
    elif summary.stress is not None:
        knee = summary.stress.knee_rps
        offered = (f"A stress run from {traffic.rate:g} requests/s: "
                   + ("no step held" if knee is None else f"the knee is {knee:g} requests/s"))
    elif summary.sla is not None:
        start = config.sla.sla_start_rps or (summary.sla.probes[0].rate_rps
                                             if summary.sla.probes else None)
        offered = (f"An SLA search from {start:g} requests/s: " if start else
                   "An SLA search: ") + found(summary.sla)
    elif traffic.trace:
        offered = f"Replayed the trace {Path(traffic.trace).name}" + trace_load(summary)
    else:
        unit = Mode(traffic.mode).rate_unit
        offered = f"Offered {traffic.rate:g} {unit} ({traffic.mode}, {traffic.arrival})"
    parts = [f"{offered} to the {config.target.target} server at {config.sender.host}, "
             f"measured over {summary.window_s:.0f} s: achieved {t.requests_per_s:.2f} "
             f"requests/s and {t.output_tokens_per_s:.1f} output tokens/s."]
    if draw := poisson_draw(summary):
        parts.append(draw)
    latency = [f"{name} p50 {fmt_ms(stats.p50)} ms, p99 {fmt_ms(stats.p99)} ms"
               for name, stats in (("TTFT", report.latency.get("ttft")),
                                   ("TPOT", report.latency.get("tpot")))
               if stats is not None and stats.count]
    late = next((f for f in report.findings if f.rule == "generator_limited" and f.fired), None)
    if latency:
        parts.append("; ".join(latency) + (", as the load generator measured them while it "
                                           "was itself late (Load generator limited): they hold "
                                           "its lateness, not the server's alone." if late
                                           else "."))
    codes = ", ".join(f"{code} {n}" for code, n in by_count(r.failed_by_code))
    parts.append(f"{r.ok} of {r.sent} requests ok" + (f", {r.failed} failed ({codes})"
                                                      if r.failed else "")
                 + (f", {r.cancelled} cancelled by the client" if r.cancelled else "")
                 + unstreamed_note(r) + ".")
    fired = [f.title for f in report.findings if f.fired]
    parts.append("Diagnosis: " + ("; ".join(fired) if fired else "no rule fired") + ".")
    return " ".join(parts)


def trace_load(summary) -> str:
    """The load a replayed trace offered: its requests over the run (and its speed-up)."""
    traffic = summary.config.traffic
    if summary.workload is None or summary.duration_s <= 0:
        return ""
    n = summary.workload.requests
    faster = f", {traffic.trace_speedup:g}x its speed" if traffic.trace_speedup != 1 else ""
    return (f" ({n} requests over {summary.duration_s:.0f} s, "
            f"{n / summary.duration_s:.2f} requests/s offered{faster})")


POISSON_NOTED = 0.05  # a draw this far (as a share) from the rate's expectation is explained


def poisson_draw(summary) -> str:
    """Where Poisson arrivals scheduled notably more or fewer requests in the window than the
    rate makes them on average: the draw and its usual range, so an achieved rate below the
    offered one is not read as the server falling short."""
    traffic, r = summary.config.traffic, summary.requests
    if (traffic.arrival != "poisson" or traffic.trace or traffic.mode != Mode.FIXED
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


def window_words(run: Run) -> str:
    summary = run.summary
    return (f"started {summary.started_at}, measured window {summary.window_s:.1f} s of "
            f"{summary.duration_s:.1f} s")


def throughput_lines(run: Run) -> list[str]:
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


def class_rows(run: Run) -> list[list[str]]:
    return [[name, str(c.sent), str(c.ok), fmt_ms(c.ttft_ms.p50), fmt_ms(c.ttft_ms.p99),
             fmt_ms(c.tpot_ms.p50), fmt_ms(c.tpot_ms.p99)]
            for name, c in run.summary.classes.items()]


SPLIT_HEADER = ["TTFT band", "requests", *PARTS, "TTFT"]


def split_rows(split: TtftSplit) -> list[list[str]]:
    return [[band, str(n), *(fmt_ms(float(ms)) for ms in means), fmt_ms(float(means.sum()))]
            for band, (n, means) in split.bands.items()]


def over_time_note(report: Report) -> str:
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


def step_rows(run: Run) -> list[list[str]]:
    return [[str(r.step), *(f"{rate:.3g}"
                            for rate in (r.offered_rps, r.sent_rps, r.achieved_rps, r.goodput_rps)),
             fmt_ms(r.ttft_p99_ms), fmt_ms(r.tpot_p99_ms), r.saturated or "-"]
            for r in run.summary.stress.steps]


def knee_line(run: Run) -> str:
    stress = run.summary.stress
    knee = stress.knee_rps
    return (f"knee: "
            f"{'none (the first step saturated)' if knee is None else f'{knee:g} requests/s'}; "
            f"stopped: {stress.stopped_because or '-'}")


def accounting_line(run: Run) -> str:
    requests = run.summary.requests
    by_code = ", ".join(f"{code} {n}" for code, n in by_count(requests.failed_by_code))
    return (f"sent {requests.sent}, ok {requests.ok}, failed {requests.failed}"
            f"{f' ({by_code})' if by_code else ''}, "
            f"{f'cancelled by the client {requests.cancelled}, ' if requests.cancelled else ''}"
            f"not sent {requests.not_sent}, warm-up {requests.warmup}{unstreamed_note(requests)}")


def unstreamed_note(requests) -> str:
    """The ok requests read whole for their routed experts, not timed ("" where none)."""
    return (f"; {requests.unstreamed} of the ok sent non-streamed for their routed experts "
            "(--routed-experts-sample): counted, not in TTFT, TPOT, ITL or goodput"
            if requests.unstreamed else "")


def generator_lines(run: Run) -> list[str]:
    generator = run.summary.generator
    sender = f"{generator.client} sender, " if generator.client else ""
    waited = ("" if generator.cpu_wait_percent is None else
              f"; waited for a core {generator.cpu_wait_percent:.1f}% of the run")
    lines = [f"{sender}late sends {generator.late_sends} (sent more than "
             f"{generator.late_threshold_ms:.1f} ms after their scheduled time); CPU "
             f"{generator.cpu_percent:.1f}% of a core{waited}"]
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


def by_count(counts: dict) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: -item[1])


def bullets(lines) -> str:
    return "\n".join(f"- {line}" for line in lines)
