"""Scenario presets (`--scenario mlperf-server:MODEL`): MLPerf Inference's server scenario for
the LLMs its rules list, as LoadGen's mlperf.conf sets it (mlcommons/inference,
loadgen/mlperf.conf: `*.Server.target_latency_percentile = 99`, `*.Server.min_duration =
600000`, each model's `Server.ttft_latency` and `Server.tpot_latency`; LoadGen's default
`min_query_count`, 100). The preset sets Poisson arrivals, the TTFT and TPOT objectives at p99;
the report judges the run against them, its duration and its query count (PASS, FAIL or NOT
VALID). `--scenario-quick` scales the minimum duration down to QUICK_S for a try, and the
verdict says the run is not rule-conformant."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

SERVER = "mlperf-server"
QUICK_S = 30.0


@dataclass(frozen=True)
class Scenario:
    model: str
    ttft_ms: float
    tpot_ms: float
    percentile: float = 99.0
    min_duration_s: float = 600.0
    min_queries: int = 100


# mlperf.conf's server-scenario latencies, ms
MODELS = {s.model: s for s in (
    Scenario("llama2-70b", 2000, 200),
    Scenario("llama2-70b-interactive", 450, 40),
    Scenario("mixtral-8x7b", 2000, 200),
    Scenario("llama3.1-405b", 6000, 175),
    Scenario("llama3.1-405b-interactive", 4500, 80),
    Scenario("llama3.1-8b", 2000, 100),
    Scenario("llama3.1-8b-interactive", 500, 30),
    Scenario("deepseek-r1", 2000, 80),
    Scenario("deepseek-r1-interactive", 1500, 15),
)}


def scenario_problem(value: str) -> str | None:
    if not value:
        return None
    kind, _, model = value.partition(":")
    if kind != SERVER or model not in MODELS:
        return (f"must be {SERVER}:MODEL, MODEL one of {', '.join(MODELS)}; got {value!r}")
    return None


def scenario_of(value: str) -> Scenario | None:
    return MODELS[value.partition(":")[2]] if value else None


def with_scenario(settings):
    """The settings (LoadSettings) with the scenario's arrivals and objectives laid over them."""
    scenario = scenario_of(settings.traffic.scenario)
    if scenario is None:
        return settings
    return dataclasses.replace(
        settings,
        traffic=dataclasses.replace(settings.traffic, arrival="poisson"),
        slo=dataclasses.replace(settings.slo, slo_ttft_ms=scenario.ttft_ms,
                                slo_tpot_ms=scenario.tpot_ms, slo_e2e_ms=None,
                                slo_percentile=scenario.percentile))
