"""The report's SLA-search section (--mode sla, loadgen/sla.py): the rate found, why the
search stopped and how long it took, and each probe: its rate, each objective's percentile
against its bound, the requests over it and needed (MLPerf's early-stopping rule), and its
verdict."""

from __future__ import annotations

from analysis.slo_claims import why
from analysis.tables import fmt_ms, markdown_table
from records.summary import SlaResult

SLA_PNG = "sla.png"


def found(sla: SlaResult) -> str:
    if sla.rate_rps is None:
        return f"no rate tried met the objectives ({sla.stopped_because})"
    return (f"{sla.rate_rps:.4g} requests/s holds the objectives (lowest failing "
            f"{sla.failed_rps:.4g}/s)" if sla.failed_rps is not None else
            f"{sla.rate_rps:.4g} requests/s holds the objectives, no faster rate tried failed") \
        + f"; {sla.stopped_because}; {len(sla.probes)} probes in {sla.search_s:.0f} s"


def probe_lines(sla: SlaResult) -> list[str]:
    return [f"probe {i} at {p.rate_rps:.4g}/s: {p.verdict} after {p.judged_s:.1f} s"
            + (f", {p.failed} failed" if p.failed else "") + ": "
            + "; ".join(why(c) for c in p.claims)
            for i, p in enumerate(sla.probes)]


def sla_text(sla: SlaResult) -> str:
    return "\n".join([f"sla: {found(sla)}", *(f"sla: {line}" for line in probe_lines(sla))])


def sla_markdown(sla: SlaResult) -> list[str]:
    metrics = sorted({c.metric for p in sla.probes for c in p.claims})
    rows = []
    for i, p in enumerate(sla.probes):
        by = {c.metric: c for c in p.claims}
        rows.append([str(i), f"{p.rate_rps:.4g}", f"{p.judged_s:.1f}"]
                    + [f"{fmt_ms(by[m].value_ms) if by[m].value_ms is not None else 'over'} / "
                       f"{by[m].limit_ms:g} ({by[m].over} of {by[m].requests} over, "
                       f"{by[m].needed:,} needed)" if m in by else "-" for m in metrics]
                    + [p.verdict])
    percentile = sla.probes[0].claims[0].percentile if sla.probes else 99
    return ["## SLA search", found(sla) + ".",
            markdown_table(["probe", "requests/s", "judged s",
                            *(f"{m} p{percentile:g} / bound (ms)" for m in metrics), "verdict"],
                           rows),
            f"![SLA search]({SLA_PNG})"]
