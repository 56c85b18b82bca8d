"""The seed's capacity planning formula (5.1) and its link to the server's capacity factor."""

import math

import pytest

from analysis.capacity import capacity_factor, planned_capacity
from server.moe import expert_capacity


def test_planned_capacity_is_average_load_over_utilisation():
    # 256 tokens, top-2, 8 experts: 64 slots per expert on average; at 50% utilisation, 128.
    assert planned_capacity(256, 2, 8, 0.5) == 128
    assert planned_capacity(256, 2, 8, 1.0) == 64


@pytest.mark.parametrize("utilisation", [0.5, 2 / 3, 0.8])
def test_capacity_factor_gives_the_servers_capacity(utilisation):
    planned = planned_capacity(100, 2, 8, utilisation)
    assert expert_capacity(100, 2, 8, capacity_factor(utilisation)) == math.ceil(planned - 1e-9)


@pytest.mark.parametrize("utilisation", [0, -0.5, 1.5])
def test_bad_utilisation_is_refused(utilisation):
    with pytest.raises(ValueError, match="utilisation"):
        planned_capacity(10, 2, 8, utilisation)
