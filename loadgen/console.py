"""The end-of-run summary a person reads in the terminal."""

from __future__ import annotations

from pathlib import Path

from loadgen.recording.limits import SPOILS
from records.jsonform import dumps
from records.summary import SlaResult, Stats, Summary

ROWS = ("ttft", "ttft_service", "tpot", "itl", "itl_token", "e2e")


def print_summary(summary: Summary, run_dir: Path) -> None:
    m, t, r = summary.metrics, summary.throughput, summary.requests
    print(f"\nmoe-loadlab run: {run_dir}")
    if summary.sla is None:
        print_latency(summary)
    else:
        print("an SLA search: its probes ran at different rates, so the run's percentiles are "
              "no one load's; each probe's are in its line above and in summary.json's sla")
    print(f"throughput: {t.output_tokens_per_s:.1f} output tokens/s, "
          f"{t.requests_per_s:.2f} requests/s, "
          f"goodput {t.goodput_requests_per_s:.2f} requests/s over {t.window_s:.1f} s")
    failed = ", ".join(f"{k} {v}" for k, v in r.failed_by_code.items()) or "none"
    cancelled = f" + cancelled by the client {r.cancelled}" if r.cancelled else ""
    unstreamed = (f"; of the ok, {r.unstreamed} sent non-streamed for their routed experts: "
                  "not timed" if r.unstreamed else "")
    print(f"requests: sent {r.sent} = ok {r.ok} + failed {r.failed} ({failed}){cancelled}; "
          f"not sent {r.not_sent}; warm-up {r.warmup}{unstreamed}")
    if summary.stress is not None:
        print_stress(summary)
    for note in summary.generator.notes:
        print(f"note: {note}")
    for warning in summary.generator.warnings:
        print(f"WARNING: {warning}")
    searched = summary.sla is not None  # no one load's percentiles
    headline = {"run_dir": str(run_dir),
                "ttft_p99_ms": None if searched else m["ttft_ms"].p99,
                "tpot_p99_ms": None if searched else m["tpot_ms"].p99,
                "output_tokens_per_s": t.output_tokens_per_s,
                "sent": r.sent, "ok": r.ok, "failed": r.failed}
    if limited := summary.generator.limited:  # the figures that measure the generator
        headline["generator_limited"] = sorted(limited)
    if searched:
        headline |= print_sla(summary.sla)
    print(dumps(headline))


def print_latency(summary: Summary) -> None:
    """The run's latency percentiles, per class and per turn where it has them, and the share
    of requests meeting each objective."""
    m = summary.metrics
    spoilt = {name: figure for figure in summary.generator.limited for name in SPOILS[figure]}
    print(f"{'ms':<14}{'count':>8}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}")
    for name in ROWS:
        s = m[f"{name}_ms"]
        if s.count and name in spoilt:  # no figure of the generator's read as the server's
            print(f"{name:<14}{s.count:>8}  generator-limited ({spoilt[name].upper()}, see "
                  "WARNING below): not a measurement of the server")
        elif s.count:
            print(f"{name:<14}{s.count:>8}{s.p50:>10.1f}{s.p90:>10.1f}{s.p99:>10.1f}{s.max:>10.1f}")
        else:
            print(f"{name:<14}{0:>8}  no samples")
    for request_class, c in summary.classes.items():
        print(f"class {request_class:<12} sent {c.sent:>6}  ok {c.ok:>6}  "
              f"TTFT p50/p99 {_p50_p99(c.ttft_ms):>15}  "
              f"TPOT p50/p99 {_p50_p99(c.tpot_ms):>13}")
    if (sessions := summary.sessions) is not None:
        print(f"sessions: {sessions.started} started, {sessions.completed} completed, "
              f"{sessions.failed} failed, {sessions.cancelled} cancelled, {sessions.stopped} "
              f"stopped by the run's end")
        for turn, c in sessions.by_turn.items():
            print(f"turn {turn:<13} sent {c.sent:>6}  ok {c.ok:>6}  "
                  f"TTFT p50/p99 {_p50_p99(c.ttft_ms):>15}  "
                  f"TPOT p50/p99 {_p50_p99(c.tpot_ms):>13}")
    slo = summary.slo
    if slo.objectives_ms and slo.requests:
        share = slo.met_share
        met = ", ".join(f"{name.upper()} <= {ms:g} ms met by {100 * share[name]:.1f}%"
                        for name, ms in slo.objectives_ms.items())
        print(f"SLO: {met}; all met by {100 * share['all']:.1f}% of {slo.requests} requests")


def print_sla(sla: SlaResult) -> dict:
    """The SLA search's answer in a line; what the JSON line adds of it."""
    print(f"SLA search: {sla_line(sla)}")
    return {"sla_rps": sla.rate_rps, "sla_verdict": sla.verdict}


def sla_line(sla: SlaResult) -> str:
    """PASS at R requests/s [the boundary's bounds], the binding objective and how it falls;
    NOT CONFIRMED; or NO ANSWER; then why the search stopped."""
    if sla.rate_rps is None:
        return f"{sla.verdict}; {sla.stopped_because}"
    above = "?" if sla.failed_rps is None else f"{sla.failed_rps:.4g}"
    found = f"{sla.verdict} at {sla.rate_rps:.4g} requests/s (the limit in [{sla.rate_rps:.4g}, " \
            f"{above}))"
    if sla.binding:
        found += f"; binding: {sla.binding}" + (f", a {sla.fall}" if sla.fall else "")
    return f"{found}; {sla.stopped_because}"


def print_stress(summary: Summary) -> None:
    stress = summary.stress
    print(f"{'stress step':<14}{'offered/s':>10}{'sent/s':>8}{'achieved/s':>11}"
          f"{'TTFT p99':>10}  saturated")
    for row in stress.steps:
        p99 = "-" if row.ttft_p99_ms is None else f"{row.ttft_p99_ms:.1f}"
        print(f"{row.step:<14}{row.offered_rps:>10.3g}{row.sent_rps:>8.3g}{row.achieved_rps:>11.3g}"
              f"{p99:>10}  {row.saturated or '-'}")
    knee = ("none (the first step saturated)" if stress.knee_rps is None
            else f"{stress.knee_rps:g} requests/s")
    print(f"knee: {knee}; stopped: {stress.stopped_because}")
    if stress.warning:
        print(f"WARNING: {stress.warning}")


def _p50_p99(stats: Stats) -> str:
    return "-" if not stats.count else f"{stats.p50:.1f}/{stats.p99:.1f}"
