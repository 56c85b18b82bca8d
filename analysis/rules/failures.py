"""The diagnosis rule for failures: when requests failed, with which codes, and when the server
could not be reached at all (requests failing UNAVAILABLE, GetStats samples failing), as
windows of the run's time. Reads requests.jsonl and server_stats.jsonl."""

from __future__ import annotations

from collections import Counter

from analysis.readers.rundir import Run
from analysis.rules.finding import Finding
from records.requests import CLIENT_CANCELLED

# Failures at most this far apart belong to one window: consecutive GetStats samples
# (--interval-s, 1 s by default) and requests at any rate above 1/s.
GAP_S = 1.5
WINDOWS_LISTED = 5
UNREACHABLE = "UNAVAILABLE"  # every target's status for a refused, reset or broken connection


def windows(times_s: list[float], gap_s: float = GAP_S) -> list[tuple[float, float, int]]:
    """Sorted times grouped into (first, last, count) runs whose gaps are at most gap_s."""
    out: list[tuple[float, float, int]] = []
    for t in sorted(times_s):
        if out and t - out[-1][1] <= gap_s:
            first, _, n = out[-1]
            out[-1] = (first, t, n + 1)
        else:
            out.append((t, t, 1))
    return out


def _listed(label: str, spans: list[tuple[float, float, int]], unit: str) -> list[str]:
    lines = [f"{label}: {n} {unit} {first:.1f}-{last:.1f} s" for first, last, n in
             spans[:WINDOWS_LISTED]]
    if len(spans) > WINDOWS_LISTED:
        lines.append(f"{label}: {len(spans) - WINDOWS_LISTED} more windows")
    return lines


def failures(run: Run) -> Finding:
    rule = ("failures", "Server unreachable / errors")
    accounting = run.summary.requests
    samples = run.samples
    rows = run.rows
    failed = [r for r in rows if r.status not in ("OK", CLIENT_CANCELLED)]
    blind = [s.t_run_s for s in samples if not s.stats.ok]
    if not accounting.failed and not blind:
        return Finding(*rule, False, f"every one of {accounting.sent} requests sent succeeded"
                       + (f" and all {len(samples)} GetStats samples answered" if samples
                          else ""), [])
    codes = Counter(accounting.failed_by_code)
    evidence = [f"{accounting.failed} of {accounting.sent} requests failed: "
                + ", ".join(f"{code} {n}" for code, n in codes.most_common())]
    for code in sorted({r.status for r in failed}):
        times = [r.scheduled_ms / 1000 for r in failed if r.status == code]
        evidence += _listed(code, windows(times), "requests scheduled")
        if example := next((r.details for r in failed if r.status == code and r.details), ""):
            evidence.append(f"{code} said: {example[:200]}")
    if blind:
        evidence += _listed("GetStats failed", windows(blind), "samples")
    if accounting.rows_omitted:
        evidence.append(f"requests.jsonl holds the first {len(rows)} requests: "
                        f"{accounting.rows_omitted} more are counted but not listed")
    down = windows([r.scheduled_ms / 1000 for r in failed if r.status == UNREACHABLE] + blind)
    if down:
        spans = ", ".join(f"{a:.1f}-{b:.1f} s" for a, b, _ in down[:WINDOWS_LISTED])
        verdict = (f"the server could not be reached ({UNREACHABLE} or GetStats failing) at "
                   f"{spans}; {accounting.failed} requests failed in all")
    else:
        verdict = (f"{accounting.failed} requests failed ("
                   + ", ".join(codes) + "); the server stayed reachable")
    return Finding(*rule, True, verdict, evidence)
