"""A GetStats reply and a /metrics scrape hold what they held before the engine's telemetry
was declared once (records/engine_telemetry.py), field by field: every field, family, help
text, label set and deterministic value, after the same sequential workload on one rank and
on two (tests/telemetry_shape.py; only the values that depend on the machine's timing are
masked). Fields and families added since may stand beside them: the contract only grows."""

import json

import pytest

from tests.telemetry_shape import FIXTURES, SCENARIOS, observe


# two ranks take seconds to start: make test runs them, test-fast does not
@pytest.mark.parametrize("scenario", [
    pytest.param(name, marks=[pytest.mark.slow] * (name != "one_rank")) for name in SCENARIOS])
def test_getstats_and_metrics_are_what_they_were(scenario):
    before = json.loads((FIXTURES / f"{scenario}.json").read_text())
    now = json.loads(json.dumps(observe(scenario)))  # as the fixture holds it: JSON types
    assert set(before["getstats"]) <= set(now["getstats"])
    for name, value in before["getstats"].items():
        assert now["getstats"][name] == value, f"GetStats field {name}"
    assert set(before["metrics"]) <= set(now["metrics"])
    for family, value in before["metrics"].items():
        assert now["metrics"][family] == value, f"/metrics family {family}"
