"""Expert load figure (experts.png): each layer's routed (token, expert) pairs by expert, as a
share of the layer's pairs relative to a uniform share, and beside it how many distinct
experts a step activated (the fewer, the fewer expert weights a step reads)."""

from pathlib import Path

import numpy as np
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from analysis.readers.server_stats import expert_shares

ANNOTATE_UP_TO = 16  # experts per layer whose cells still have room for a number


def plot_experts(expert_tokens: np.ndarray, active_experts_steps: np.ndarray | None,
                 path: Path) -> None:
    n_layers, n_experts = expert_tokens.shape
    width = min(4 + 0.6 * n_experts, 16) + (4.5 if active_experts_steps is not None else 0)
    fig = Figure(figsize=(width, max(min(2 + 0.45 * n_layers, 12), 4)), layout="constrained")
    if active_experts_steps is None:
        heat = fig.subplots()
    else:
        heat, active = fig.subplots(1, 2, width_ratios=[max(n_experts, 4), 4])
        _draw_active(active, active_experts_steps)
    vs_uniform = expert_shares(expert_tokens) * n_experts  # 1 = the uniform share
    # Diverging around 1: blue cold experts, red hot ones, white the uniform share.
    norm = TwoSlopeNorm(vcenter=1.0, vmin=0.0, vmax=max(float(vs_uniform.max()), 1.01))
    image = heat.imshow(vs_uniform, cmap="coolwarm", norm=norm, aspect="auto")
    if n_experts <= ANNOTATE_UP_TO:
        for (layer, expert), value in np.ndenumerate(vs_uniform):
            heat.text(expert, layer, f"{value:.2f}", ha="center", va="center", fontsize="small")
    heat.set_xlabel("expert id")
    heat.set_ylabel("MoE layer")
    if n_experts <= ANNOTATE_UP_TO * 2:
        heat.set_xticks(range(n_experts))
    heat.set_yticks(range(n_layers))
    heat.set_title(f"Expert load vs uniform (1 = 1/{n_experts} of the layer's pairs)")
    fig.colorbar(image, ax=heat, label="share x experts")
    fig.savefig(path, dpi=90)


def _draw_active(ax, steps: np.ndarray) -> None:
    share = steps / steps.sum()
    mean = float((steps * np.arange(len(steps))).sum() / steps.sum())
    ax.bar(np.arange(len(steps)), 100 * share, color="C0")
    ax.axvline(mean, color="C3", ls="--", label=f"mean {mean:.2f}")
    ax.set_xlabel("distinct experts a step activated")
    ax.set_ylabel("% of layer-steps")
    ax.set_title("Experts per step")
    ax.set_xticks(range(len(steps)))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small")
