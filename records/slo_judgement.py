"""Every objective judged one way, wherever it is judged: the SLA search's probes
(loadgen/sla/search.py), stress mode's steps (loadgen/modes/stress.py) and the reports
(`analysis report`, `compare`, `soak`: analysis/slo_claims.py).

Each objective given (--slo-ttft-ms, --slo-tpot-ms, --slo-e2e-ms) is a claim at
--slo-percentile ("TTFT p99 <= 2000 ms") on a sample of requests:
- those that ended, at their figure; a failed one counts over every limit;
- those still waiting, where their age already puts them over a TTFT or E2E limit (still
  waiting for the first token, for TTFT; at all, for E2E): a stalled server cannot hide behind
  requests that have not answered yet.
The claim's percentile (nearest rank), the requests over its limit and whether they support it
(MLPerf's early-stopping rule) come from records/early_stopping.py's `judge`."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from records.early_stopping import Judged, judge
from records.load_settings import SloSettings


@dataclass(frozen=True)
class Objective:
    metric: str  # as the claims name it: TTFT, TPOT, E2E
    field: str  # the request's figure (records/requests.py's RequestRow, in ms)
    setting: str  # its limit's setting
    waits_count: str  # which requests still waiting count over it: "unanswered", "any", ""


OBJECTIVES = (Objective("TTFT", "ttft_ms", "slo_ttft_ms", "unanswered"),
              Objective("TPOT", "tpot_ms", "slo_tpot_ms", ""),
              Objective("E2E", "e2e_ms", "slo_e2e_ms", "any"))


@dataclass(frozen=True)
class StillWaiting:
    """A request of the sample not ended yet."""

    age_ms: float  # since it was scheduled
    answered: bool  # its first token came


def value_text(value_ms: float | None, digits: int = 1) -> str:
    """A claim's percentile in words: "-" without requests, "over" where its rank falls among
    requests known only to be over (failed, or waiting past the limit)."""
    if value_ms is None:
        return "-"
    return "over" if math.isinf(value_ms) else f"{value_ms:.{digits}f} ms"


def given(slo: SloSettings) -> list[tuple[Objective, float]]:
    """The objectives set, each with its limit in ms."""
    return [(o, limit) for o in OBJECTIVES if (limit := getattr(slo, o.setting)) is not None]


def late(objective: Objective, limit_ms: float, waiting: Iterable[StillWaiting]) -> int:
    """The requests still waiting that are over the objective's limit already."""
    if not objective.waits_count:
        return 0
    return sum(1 for w in waiting if w.age_ms > limit_ms
               and (objective.waits_count == "any" or not w.answered))


def judge_objectives(slo: SloSettings, values: Mapping[str, list[float]], failed: int = 0,
                     waiting: Iterable[StillWaiting] = ()) -> list[Judged]:
    """One claim per objective set, at slo.slo_percentile. values: each field's figures (ms) of
    the requests that ended ok; failed: those that ended failed."""
    waiting = list(waiting)
    return [judge(o.metric, list(values.get(o.field, ())), limit, slo.slo_percentile,
                  failed + late(o, limit, waiting))
            for o, limit in given(slo)]
