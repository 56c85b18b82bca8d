"""Expert load heatmap: each layer's routed (token, expert) pairs by expert, as a share of the
layer's pairs relative to a uniform share (experts.png)."""

from pathlib import Path

import numpy as np
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from analysis.server_stats import expert_shares

ANNOTATE_UP_TO = 16  # experts per layer whose cells still have room for a number


def plot_expert_heatmap(expert_tokens: np.ndarray, path: Path) -> None:
    n_layers, n_experts = expert_tokens.shape
    vs_uniform = expert_shares(expert_tokens) * n_experts  # 1 = the uniform share
    fig = Figure(figsize=(min(4 + 0.6 * n_experts, 16), min(2 + 0.45 * n_layers, 12)), layout="constrained")
    ax = fig.subplots()
    # Diverging around 1: blue cold experts, red hot ones, white the uniform share.
    norm = TwoSlopeNorm(vcenter=1.0, vmin=0.0, vmax=max(float(vs_uniform.max()), 1.01))
    image = ax.imshow(vs_uniform, cmap="coolwarm", norm=norm, aspect="auto")
    if n_experts <= ANNOTATE_UP_TO:
        for (layer, expert), value in np.ndenumerate(vs_uniform):
            ax.text(expert, layer, f"{value:.2f}", ha="center", va="center", fontsize="small")
    ax.set_xlabel("expert id")
    ax.set_ylabel("MoE layer")
    ax.set_xticks(range(n_experts) if n_experts <= ANNOTATE_UP_TO * 2 else ax.get_xticks())
    ax.set_yticks(range(n_layers))
    ax.set_title(f"Expert load vs uniform (1 = 1/{n_experts} of the layer's routed pairs)")
    fig.colorbar(image, ax=ax, label="share x experts")
    fig.savefig(path, dpi=90)
