"""Expert capacity planning (seed 5.1).

capacity = tokens x k / (experts x target utilisation): the slots per expert per step that
keep an average expert at the target utilisation. The seed advises 1.5-2x the average
load (utilisation 0.5-0.67) to absorb bursts. The server's capacity factor is the inverse
view: capacity = ceil(tokens x k / experts x CF), so CF = 1 / target utilisation.
"""

from __future__ import annotations


def planned_capacity(tokens: int, top_k: int, n_experts: int, target_utilisation: float) -> float:
    """Slots per expert for one step of `tokens` tokens at the target utilisation (0, 1]."""
    if not 0 < target_utilisation <= 1:
        raise ValueError(f"target utilisation must be in (0, 1], got {target_utilisation}")
    if tokens < 0 or top_k < 1 or n_experts < 1:
        raise ValueError("tokens >= 0, top_k >= 1 and n_experts >= 1 are required")
    return tokens * top_k / (n_experts * target_utilisation)


def capacity_factor(target_utilisation: float) -> float:
    """The server's --capacity-factor that gives the same capacity."""
    return 1 / target_utilisation
