"""One recommendation from repeat runs of batching policies (`analysis compare --runs`, `make
compare`; docs/compare.md): each policy's verdict against the baseline over runs, at the runs'
load and objectives, and the policy to pick.

A policy is judged on goodput first (requests/s meeting the objectives): where goodput is told
apart, that decides; where it is not, on the latency figures (TTFT and TPOT p50 and p99): better
on some and worse on none is better, the reverse worse, both a trade-off. A policy whose runs held
no work back (the server's plans left nothing out, analysis/policy_choice.py) made no choice: a
difference it shows is not its policy's, and it is not credited with one. A second copy of the
baseline's configuration (named as such: `--aa`) is the A/A pair: if it is told apart from the
baseline on anything, the machine's run-to-run noise is more than the intervals allow, and
nothing is recommended.

The pick: the first policy better than the baseline, in the order given; else the baseline, where
some policy is worse than it; else none (null): no policy is distinguishable."""

from __future__ import annotations

from dataclasses import dataclass

from analysis.repeats import BETTER, DECIDING, SAME, WORSE, Paired, Repeats, change_text

MIXED, NOT_ATTRIBUTED, AA = "a trade-off", "not its policy's", "A/A"


@dataclass(frozen=True)
class Evidence:
    """What a configuration's server did, over its runs: why a policy wins or loses."""

    policy: str | None
    held_back: list[int | None]  # plans that left work out, per run
    mean_batch: float | None
    experts_per_step: float | None

    @property
    def held_nothing(self) -> bool:
        return bool(self.held_back) and all(h == 0 for h in self.held_back)

    def text(self) -> str:
        known = [h for h in self.held_back if h is not None]
        held = "held back ?" if not known else f"held back {sum(known) / len(known):.0f}/run"
        batch = "-" if self.mean_batch is None else f"{self.mean_batch:.2f}"
        experts = "-" if self.experts_per_step is None else f"{self.experts_per_step:.2f}"
        return f"{held}, mean batch {batch}, experts/step {experts}"


@dataclass(frozen=True)
class PolicyVerdict:
    config: str
    policy: str | None
    verdict: str  # BETTER, WORSE, SAME, MIXED, NOT_ATTRIBUTED or AA
    told: dict[str, Paired]  # the figures told apart
    why: str

    def as_json(self, r: Repeats, i: int) -> dict:
        return {"config": self.config, "policy": self.policy, "verdict": self.verdict,
                "why": self.why, "n_runs": len(r.groups[i]),
                "figures": {label: p.as_json() for label, p in r.against[i].items()
                            if p is not None}}


def _told(r: Repeats, i: int) -> dict[str, Paired]:
    return {f.label: p for f in DECIDING
            if (p := r.against[i][f.label]) is not None and p.verdict != SAME}


def _figures_text(told: dict[str, Paired]) -> str:
    return "; ".join(f"{label.split(' (')[0]} {change_text(p)}" for label, p in told.items())


def judge(r: Repeats, i: int, ev: Evidence, aa: bool) -> PolicyVerdict:
    """aa: whether this configuration is a copy of the baseline's."""
    told = _told(r, i)
    name = r.names[i]
    if aa:
        return PolicyVerdict(name, ev.policy, AA, told, _figures_text(told) or
                       f"indistinguishable from {r.names[r.baseline]} on every figure")
    if not told:
        return PolicyVerdict(name, ev.policy, SAME, told, "no figure told apart")
    if ev.held_nothing:
        return PolicyVerdict(name, ev.policy, NOT_ATTRIBUTED, told,
                       f"{_figures_text(told)}; but it held no work back, so every request ran "
                       f"at the first step it could and its plans were any continuous policy's: "
                       f"the difference is the machine's, not its policy's")
    goodput = told.get(DECIDING[0].label)
    kinds = {p.verdict for p in told.values()}
    verdict = goodput.verdict if goodput else (BETTER if kinds == {BETTER} else
                                               WORSE if kinds == {WORSE} else MIXED)
    return PolicyVerdict(name, ev.policy, verdict, told, _figures_text(told))


@dataclass(frozen=True)
class Recommendation:
    policy: str | None
    headline: str
    verdicts: list[PolicyVerdict]
    aa_ok: bool | None  # None without an A/A pair
    would_change: str  # what would change it


def _names(vs: list[PolicyVerdict]) -> str:
    names = [v.config for v in vs]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"


def recommend(r: Repeats, evidence: list[Evidence], at: str,
              aa: int | None = None) -> Recommendation:
    """at: the load and objectives the runs were judged at ("at 34 requests/s with ..."); aa:
    the configuration that copies the baseline's, if any."""
    base = r.names[r.baseline]
    verdicts = [judge(r, i, ev, i == aa)
                for i, ev in enumerate(evidence) if i != r.baseline]
    aa = [v for v in verdicts if v.verdict == AA]
    aa_ok = None if not aa else not any(v.told for v in aa)
    others = [v for v in verdicts if v.verdict != AA]
    better = [v for v in others if v.verdict == BETTER]
    worse = [v for v in others if v.verdict == WORSE]
    change = would_change(r, verdicts)
    if aa_ok is False:
        return Recommendation(None, f"{at}: no recommendation: {base} against itself was told "
                              f"apart ({_figures_text(aa[0].told)}): run-to-run noise on this "
                              f"machine is more than the intervals allow; run more repeats or on "
                              f"a quieter machine", verdicts, aa_ok, change)
    pick = better[0].config if better else base if worse else None
    if pick is None:
        return Recommendation(None, f"{at}: no policy is distinguishable from {base}",
                              verdicts, aa_ok, change)
    chosen = next((v for v in better if v.config == pick), None)
    goodput = DECIDING[0].label
    if chosen:
        i = r.names.index(pick)
        why = f"goodput {change_text(r.against[i][goodput])} against {base}; {chosen.why}"
    else:
        mean = r.per_config[r.baseline].get(goodput)
        why = ("" if mean is None else f"goodput {mean.mean:.4g} requests/s "
               f"[{mean.low:.4g}, {mean.high:.4g}] over {mean.n} runs")
    parts = [f"{at}: pick {pick}" + (f" ({why})" if why else "")]
    rest = [v for v in others if v.config != pick]
    for kind, words in ((BETTER, f"also better than {base}, not compared with {pick}"),
                        (SAME, f"indistinguishable from {base}"),
                        (NOT_ATTRIBUTED, "differ from it by the machine, not the policy"),
                        (MIXED, f"trade one figure for another against {base}"),
                        (WORSE, f"worse than {base}")):
        group = [v for v in rest if v.verdict == kind]
        if group:
            parts.append(f"{_names(group)} {words}")
    return Recommendation(evidence_policy(evidence, r, pick), "; ".join(parts), verdicts, aa_ok,
                          change)


def would_change(r: Repeats, verdicts: list[PolicyVerdict]) -> str:
    """What would change the verdicts: the widest interval among the figures read
    indistinguishable (more rounds narrow it), and the load and objectives they were judged at."""
    deciding = {f.label for f in DECIDING}
    widest = max([((p.fractions[2] - p.fractions[1]) / 2, v.config, label)
                  for v in verdicts for label, p in r.against[r.names.index(v.config)].items()
                  if p is not None and p.verdict == SAME and label in deciding], default=None)
    if widest is None:
        return ("at a load nearer the knee, where more work waits, or at tighter objectives, the "
                "verdicts may differ")
    half, config, label = widest
    return (f"intervals of figures read indistinguishable reach +-{100 * half:.0f}% ({config}, "
            f"{label.split(' (')[0]}): more rounds (--repeats) narrow them and could tell a "
            f"smaller difference apart; at a load nearer the knee, where more work waits, or at "
            f"tighter objectives, which goodput would then tell apart, the verdicts may differ")


def evidence_policy(evidence: list[Evidence], r: Repeats, config: str) -> str | None:
    """The policy a configuration ran (its name where the server did not say)."""
    i = r.names.index(config)
    return evidence[i].policy or config
