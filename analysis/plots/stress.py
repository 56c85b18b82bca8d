"""Stress-run figure (stress.png): the throughput-latency curve, one point per rate step, and
goodput against the offered rate with the knee marked."""

from pathlib import Path

from matplotlib.figure import Figure

from analysis.plots.cdf import log_scale
from records.summary import StepRow


def plot_stress(steps: list[StepRow], knee_rps: float | None, path: Path) -> None:
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    curve, goodput = fig.subplots(1, 2)
    achieved = [s.achieved_rps for s in steps]
    for key, label, marker in (("ttft_p99_ms", "TTFT p99", "o-"),
                               ("tpot_p99_ms", "TPOT p99", "s-")):
        points = [(a, getattr(s, key)) for a, s in zip(achieved, steps, strict=True)
                  if getattr(s, key) is not None]
        if points:
            curve.plot(*zip(*points, strict=True), marker, ms=4, label=label)
    if curve.has_data():
        log_scale(curve, "y")
    curve.set_title("Throughput vs latency (one point per step)")
    curve.set_xlabel("achieved requests/s")
    curve.set_ylabel("ms (log scale)")
    offered = [s.offered_rps for s in steps]
    goodput.plot(offered, offered, ":", color="grey", label="offered (ideal)")
    # Achieved drawn wide and pale under goodput, so both show where they coincide.
    goodput.plot(offered, achieved, "o-", lw=5, ms=9, alpha=0.35, label="achieved")
    goodput.plot(offered, [s.goodput_rps for s in steps], "s-", ms=4,
                 label="goodput (met the SLOs)")
    if knee_rps is not None:
        goodput.axvline(knee_rps, color="C3", ls="--", label=f"knee {knee_rps:g}/s")
    goodput.set_title("Goodput vs offered rate")
    goodput.set_xlabel("offered requests/s")
    goodput.set_ylabel("requests/s")
    for ax in (curve, goodput):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=90)
