"""A diagnosis rule's outcome, shared by the rules (analysis/diagnosis.py and the modules of
analysis/rules/)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    """One rule's outcome: fired, did not, or could not be judged (judged False), and why."""

    rule: str  # short id, e.g. "expert_imbalance"
    title: str
    fired: bool
    verdict: str  # one sentence, or what was missing when the rule could not be judged
    evidence: list[str]  # the numbers (and interval times) behind the verdict
    judged: bool = True  # False when the run lacks the data the rule needs
