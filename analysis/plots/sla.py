"""SLA search figure (sla.png): each probe's rate against each objective's percentile, with
the objective's bound, the probes that passed and those that failed told apart, and the rate
found."""

import math
from pathlib import Path

from matplotlib.figure import Figure

from analysis.plots.cdf import log_scale
from records.summary import ProbeVerdict, SlaResult

MARKERS = {ProbeVerdict.PASS: "o", ProbeVerdict.FAIL: "x", ProbeVerdict.NOT_VALID: "^",
           ProbeVerdict.SET_ASIDE: "s"}


def plot_sla(sla: SlaResult, path: Path) -> None:
    metrics = sorted({c.metric for p in sla.probes for c in p.claims})
    fig = Figure(figsize=(5 + 4 * len(metrics), 4.6), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics, strict=True):
        for verdict, marker in MARKERS.items():
            points = [(p.rate_rps, c.value_ms) for p in sla.probes for c in p.claims
                      if c.metric == metric and p.verdict == verdict
                      and c.value_ms is not None and math.isfinite(c.value_ms)]
            if points:
                ax.plot(*zip(*points, strict=True), marker, ms=7, ls="none",
                        label=f"{verdict.lower()}")
        limits = {c.limit_ms for p in sla.probes for c in p.claims if c.metric == metric}
        for limit in limits:
            ax.axhline(limit, color="C3", ls=":", label=f"bound {limit:g} ms")
        if sla.rate_rps is not None:
            ax.axvline(sla.rate_rps, color="C2", ls="--", label=f"found {sla.rate_rps:.4g}/s")
        if ax.has_data():
            log_scale(ax, "y")
        percentile = sla.probes[0].claims[0].percentile
        ax.set_title(f"{metric} p{percentile:g} per probe")
        ax.set_xlabel("offered requests/s")
        ax.set_ylabel("ms (log scale)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=90)
