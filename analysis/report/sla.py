"""The report's SLA-search section (--mode sla, loadgen/sla/search.py): the rate found and the
bounds the limit lies between, the objective that binds and whether it falls as a cliff or a
slope, why the search stopped and how long it took, the ramp that chose its first rate, and
each probe: its rate, each objective's percentile against its bound, the requests over it and
needed (MLPerf's early-stopping rule), its verdict and why (those set aside because the load
generator fell behind among them); the confirming probes at the rate found (--sla-confirm),
with each percentile's Student-t interval over them; and the search's verdict, the report's
last line."""

from __future__ import annotations

from analysis.repeats import t_interval
from analysis.slo_claims import why
from analysis.tables import fmt_ms, markdown_table
from records.early_stopping import Verdict
from records.summary import SlaProbe, SlaResult

SLA_PNG = "sla.png"
MIXED_RATES = ("an SLA search: its probes ran at different rates, so the run's latency "
               "percentiles are no one load's; each probe's claims are in the SLA search")


def found(sla: SlaResult) -> str:
    took = f"{len(sla.probes)} probes in {sla.search_s:.0f} s"
    if sla.ramp:
        took += f", from a ramp of {len(sla.ramp)} steps"
    if sla.rate_rps is None:
        return f"no rate tried passed ({sla.stopped_because}); {took}"
    if sla.failed_rps is None:
        return (f"{sla.rate_rps:.4g} requests/s holds the objectives, no faster rate tried "
                f"failed; {sla.stopped_because}; {took}")
    binds = (f"; binding: {sla.binding}" + (f", a {sla.fall} between them" if sla.fall else "")
             if sla.binding else "")
    return (f"{sla.rate_rps:.4g} requests/s holds the objectives (lowest failing "
            f"{sla.failed_rps:.4g}/s: the limit lies between){binds}; {sla.stopped_because}; "
            f"{took}")


def ramp_line(sla: SlaResult) -> list[str]:
    if not sla.ramp:
        return []
    last = sla.ramp[-1]
    return ["ramp to the first probe: " + ", ".join(f"{s.rate_rps:.4g}" for s in sla.ramp)
            + " requests/s" + (f"; trouble at {last.rate_rps:.4g}: {last.trouble}"
                               if last.trouble else "")]


def labelled(sla: SlaResult) -> list[tuple[str, SlaProbe]]:
    return ([(f"probe {i}", p) for i, p in enumerate(sla.probes)]
            + [(f"confirming {i}", p) for i, p in enumerate(sla.confirmations)])


def probe_lines(sla: SlaResult) -> list[str]:
    return [f"{label} at {p.rate_rps:.4g}/s: {p.verdict} after {p.judged_s:.1f} s"
            + (f" ({p.why})" if p.why else "")
            + (f", {p.failed} failed" if p.failed else "") + ": "
            + "; ".join(why(c) for c in p.claims)
            for label, p in labelled(sla)]


def confirmation_lines(sla: SlaResult) -> list[str]:
    """How the confirming probes went, and each objective's percentile over them: the mean
    and its 95% Student-t interval (two probes or more)."""
    probes = sla.confirmations
    if not probes:
        return []
    passed = sum(p.verdict == Verdict.PASS for p in probes)
    lines = [f"{passed} of {len(probes)} confirming probes at {sla.rate_rps:.4g}/s passed"]
    for i, c in enumerate(probes[0].claims):
        values = [p.claims[i].value_ms for p in probes]
        if None in values or len(values) < 2:
            continue
        interval = t_interval(values, 0.95)
        lines.append(f"{c.metric} p{c.percentile:g} over them {interval.mean:.1f} ms "
                     f"[{interval.low:.1f}, {interval.high:.1f}] (95%, Student t over "
                     f"{len(values)} probes; bound {c.limit_ms:g} ms)")
    return lines


def sla_verdict(sla: SlaResult) -> str:
    """The report's last line for an SLA search."""
    if sla.verdict == "NO ANSWER":
        return f"verdict: NO ANSWER: {sla.stopped_because}"
    failed = sum(p.verdict != Verdict.PASS for p in sla.confirmations)
    if sla.confirmed is False:
        return (f"verdict: NOT CONFIRMED: {sla.rate_rps:.4g} requests/s passed its probe, then "
                f"{failed} of {len(sla.confirmations)} confirming probes did not pass")
    confirmed = (f", confirmed by {len(sla.confirmations)} probes" if sla.confirmed
                 else " (not confirmed: --sla-confirm N repeats the probe)")
    bounds = "" if sla.failed_rps is None else f" (the limit below {sla.failed_rps:.4g})"
    return f"verdict: PASS at {sla.rate_rps:.4g} requests/s{bounds}{confirmed}"


def sla_text(sla: SlaResult) -> str:
    return "\n".join([f"sla: {found(sla)}",
                      *(f"sla: {line}" for line in ramp_line(sla) + probe_lines(sla)
                        + confirmation_lines(sla))])


def sla_markdown(sla: SlaResult) -> list[str]:
    metrics = sorted({c.metric for p in sla.probes for c in p.claims})
    rows = []
    for label, p in labelled(sla):
        by = {c.metric: c for c in p.claims}
        rows.append([label, f"{p.rate_rps:.4g}", f"{p.judged_s:.1f}"]
                    + [f"{fmt_ms(by[m].value_ms) if by[m].value_ms is not None else 'over'} / "
                       f"{by[m].limit_ms:g} ({by[m].over} of {by[m].requests} over, "
                       f"{by[m].needed:,} needed)" if m in by else "-" for m in metrics]
                    + [p.verdict])
    percentile = sla.probes[0].claims[0].percentile if sla.probes else 99
    return ["## SLA search", f"{found(sla)}. {sla_verdict(sla).removeprefix('verdict: ')}.",
            markdown_table(["probe", "requests/s", "judged s",
                            *(f"{m} p{percentile:g} / bound (ms)" for m in metrics), "verdict"],
                           rows),
            *(f"- {line}" for line in ramp_line(sla) + confirmation_lines(sla)),
            f"![SLA search]({SLA_PNG})"]
