"""Latency CDF figure: one panel per metric, drawn from the histograms' recorded buckets, log
latency across and the fraction on a logit scale, which spreads the tail (p90, p99, p99.9)
as much as the middle."""

from pathlib import Path

from hdrh.histogram import HdrHistogram

# Figure without pyplot: no global figure state and no GUI backend; PNG output renders through Agg.
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogFormatter, NullFormatter

from analysis.readers.latency import US_PER_MS, cdf_ms
from analysis.tables import fmt_ms
from records.hdr import PERCENTILES, percentiles_us

# Panel title -> histograms drawn in it; the service views (from the actual send) sit beside the
# open-loop ones (from the scheduled send), so generator lag shows as the gap between two curves.
PANELS = {"TTFT": ("ttft", "ttft_service"), "TPOT": ("tpot",), "ITL": ("itl",),
          "E2E": ("e2e", "e2e_service")}
MARKED = ("p50", "p99")
FRACTION_TICKS = (0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)


def plot_latency_cdf(histograms: dict[str, HdrHistogram], path: Path) -> None:
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    for ax, (title, names) in zip(fig.subplots(2, 2).flat, PANELS.items(), strict=True):
        ax.set_title(title)
        ax.set_xlabel("latency (ms, log scale)")
        ax.set_ylabel("share ≤ x (logit scale)")
        ax.grid(True, which="both", alpha=0.3)
        drawn = [name for name in names
                 if name in histograms and histograms[name].get_total_count()]
        if not drawn:
            ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        most = max(histograms[name].get_total_count() for name in drawn)
        for name in drawn:
            _draw_cdf(ax, name, histograms[name])
        log_scale(ax, "x")
        ax.set_yscale("logit")
        # From half a sample to one minus half a sample: the logit of 0 and 1 is infinite.
        low, high = 0.5 / (most + 1), 1 - 0.5 / (most + 1)
        ax.set_ylim(low, high)
        ax.set_yticks([q for q in FRACTION_TICKS if low <= q <= high])
        ax.yaxis.set_major_formatter(FuncFormatter(lambda q, _: f"{100 * q:g}%"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.legend(loc="upper left", fontsize="small")
    fig.suptitle("Latency CDF (marks: p50, p99)")
    fig.savefig(path, dpi=100)


def log_scale(ax, which: str) -> None:
    """A log scale on ax's "x" or "y" axis, labelled with plain numbers (20, 30, 1000) rather
    than 2x10^1; minor ticks get labels when the range is narrow."""
    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    axis.set_major_formatter(LogFormatter(labelOnlyBase=False))
    axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def _draw_cdf(ax, name: str, hist: HdrHistogram) -> None:
    n = hist.get_total_count()
    edges_ms, fraction = cdf_ms(hist)
    fraction = fraction.clip(0.5 / (n + 1), 1 - 0.5 / (n + 1))
    by_percentile = percentiles_us(hist, [PERCENTILES[key] for key in MARKED])
    marks = {key: by_percentile[PERCENTILES[key]] / US_PER_MS for key in MARKED}
    label = (f"{name} (n={n}; " + ", ".join(f"{key} {fmt_ms(ms)} ms" for key, ms in marks.items())
             + ")")
    (line,) = ax.plot(edges_ms, fraction, drawstyle="steps-post", label=label)
    for key, value_ms in marks.items():
        ax.plot([value_ms], [min(PERCENTILES[key] / 100, 1 - 0.5 / (n + 1))], "o",
                color=line.get_color())
