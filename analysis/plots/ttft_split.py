"""TTFT split figure: one stacked bar per TTFT band, the mean ms of each part (ttft_split.png)."""

from pathlib import Path

from matplotlib.figure import Figure

from analysis.ttft_split import PARTS, TtftSplit


def plot_ttft_split(split: TtftSplit, path: Path) -> None:
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    ax = fig.subplots()
    labels = [f"{band}\n(n={n})" for band, (n, _) in split.bands.items()]
    left = [0.0] * len(labels)
    for i, part in enumerate(PARTS):
        widths = [max(float(means[i]), 0.0) for _, means in split.bands.values()]
        ax.barh(labels, widths, left=left, label=part, color=f"C{i}")
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("mean ms (bar length = mean TTFT of the band)")
    ax.set_title("Where TTFT went, by TTFT band")
    ax.grid(True, axis="x", alpha=0.3)
    fig.legend(loc="outside lower center", ncols=len(PARTS), fontsize="small")
    fig.savefig(path, dpi=90)
