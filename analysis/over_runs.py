"""The part of `analysis compare --runs` that stands on repeat runs: each configuration's figures
over its runs, each against the baseline round by round (analysis/repeats.py), the evidence of
what each server did, and the recommendation (analysis/recommendation.py), as text, markdown and
compare.json's `over_runs` and `recommendation`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.policy_choice import held_back
from analysis.readers.rundir import Run
from analysis.readers.server_stats import server_view
from analysis.recommendation import AA, Evidence, Recommendation, recommend
from analysis.repeats import Repeats, against_table, how, means_table, repeats, significant
from analysis.tables import markdown_table, text_table
from records.declare import flat


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None


def evidence(runs: list[Run]) -> Evidence:
    views = [server_view(r.summary.server) for r in runs]
    policies = {v.policy for v in views if v is not None and v.policy}
    return Evidence(policies.pop() if len(policies) == 1 else None,
                    [held_back(r.summary.server, v) for r, v in zip(runs, views, strict=True)],
                    _mean([v.mean_batch_size for v in views if v is not None]),
                    _mean([v.distinct_experts_per_step for v in views if v is not None]))


def judged_at(run: Run) -> str:
    """'at 34 requests/s with TTFT p99 <= 500 ms and TPOT p99 <= 100 ms'"""
    config = flat(run.summary.config)
    slo = run.summary.config.slo
    p = f"p{slo.slo_percentile:g}"
    limits = [f"{label} {p} <= {ms:g} ms" for label, ms in
              (("TTFT", slo.slo_ttft_ms), ("TPOT", slo.slo_tpot_ms), ("E2E", slo.slo_e2e_ms))
              if ms is not None]
    unit = "sessions/s" if config.get("mode") == "sessions" else "requests/s"
    load = f"at {config['rate']:g} {unit}" if config.get("rate") else "at the runs' load"
    return load + (" with " + " and ".join(limits) if limits else " with no objective set")


@dataclass(frozen=True)
class OverRuns:
    repeated: Repeats
    evidence: list[Evidence]
    recommendation: Recommendation

    def evidence_rows(self) -> list[list[str]]:
        verdicts = {v.config: v for v in self.recommendation.verdicts}
        return [[name, ev.policy or "-", ev.text(),
                 "baseline" if name not in verdicts else verdicts[name].verdict,
                 "" if name not in verdicts else verdicts[name].why]
                for name, ev in zip(self.repeated.names, self.evidence, strict=True)]

    def as_json(self) -> dict:
        r = self.repeated
        rec = self.recommendation
        index = {name: i for i, name in enumerate(r.names)}
        return {"recommendation": {
            "policy": rec.policy, "text": rec.headline, "aa_check": rec.aa_ok,
            "would_change": rec.would_change,
            "verdicts": [v.as_json(r, index[v.config]) for v in rec.verdicts]},
            "over_runs": {"confidence": r.confidence, "each_interval": r.each,
                          "family": r.family, "significant": significant(r),
                          "aa_pairs": [v.config for v in rec.verdicts if v.verdict == AA]}}


def over_runs(groups: list[list[Run]], baseline: int, confidence: float,
              aa: int | None = None) -> OverRuns:
    """aa: the configuration that is a second copy of the baseline's (the A/A pair)."""
    r = repeats(groups, confidence, baseline)
    ev = [evidence(g) for g in groups]
    return OverRuns(r, ev, recommend(r, ev, judged_at(groups[baseline][0]), aa))


EVIDENCE_HEADER = ["configuration", "policy", "what its server did", "verdict", "why"]


def aa_line(o: OverRuns) -> str:
    ok = o.recommendation.aa_ok
    return ("A/A: no copy of the baseline's configuration (--aa), so the noise floor is not "
            "checked"
            if ok is None else "A/A: the baseline against itself: indistinguishable on every "
            "figure (the intervals hold on this machine)" if ok else
            "A/A: the baseline against itself was told apart: the intervals do not hold here")


def over_runs_text(o: OverRuns) -> str:
    r = o.repeated
    return "\n\n".join([
        "over runs (Student t over the runs; the within-run bootstrap of round 1 is above):\n"
        + text_table(*means_table(r)),
        f"against {r.names[r.baseline]}, round by round:\n" + text_table(*against_table(r)),
        how(r), text_table(EVIDENCE_HEADER, o.evidence_rows()), aa_line(o),
        "what would change it: " + o.recommendation.would_change,
        "recommendation: " + o.recommendation.headline])


def over_runs_markdown(o: OverRuns) -> list[str]:
    r = o.repeated
    return ["## Recommendation", o.recommendation.headline, aa_line(o) + ".",
            f"What would change it: {o.recommendation.would_change}.",
            "## Over runs", markdown_table(*means_table(r)),
            f"## Against {r.names[r.baseline]}, round by round", markdown_table(*against_table(r)),
            how(r) + ".", "## What each server did", markdown_table(EVIDENCE_HEADER,
                                                                   o.evidence_rows())]
