"""Whether the batching policy had anything to decide in a run. The server counts the plans that
left work out (`plans_held_back`: a request kept waiting, a resident one not run, a prompt cut;
docs/metrics.md); where none did, every request ran at the first step it could, and every
continuous-batching policy would have planned the same steps. Runs of such policies that held
nothing back differ by the machine, run to run, not by the policy: `analysis compare` marks
the verdicts between them "same plans" instead of better or worse, and says why."""

from __future__ import annotations

from analysis.confidence import span
from analysis.readers.server_stats import ServerView
from records.summary import ServerSnapshots

SAME_PLANS = "same plans"


def held_back(server: ServerSnapshots, view: ServerView | None) -> int | None:
    """The plans that left work out over the run (view: server_view(server)); None where the
    server does not count them."""
    latest = server.latest
    if view is None or latest is None or latest.plans_held_back < 0:
        return None
    return int(view.counters["plans_held_back"])


def _alike_text(against: dict, other: str) -> str:
    ratio = (span(against["ratio"], against["ci"]) if against.get("ci")
             else "no ratio" if against.get("ratio") is None else f"x{against['ratio']:.3g}")
    return f"same plans as {other} ({ratio}): the machine's, not the policy's"


def mark_same_plans(comparisons: dict[str, dict], names: list[str], held: list[int | None],
                    baseline: int) -> str:
    """Re-words, in place, each verdict between two runs that both held nothing back (against
    the baseline, and the best against the second best); returns the note that explains it, ""
    where fewer than two runs held nothing back."""
    alike = [n for n, h in zip(names, held, strict=True) if h == 0]
    if len(alike) < 2:
        return ""
    base = names[baseline]
    for c in comparisons.values():
        for r in c["runs"]:
            against = r["vs_baseline"]
            if (base in alike and r["run"] in alike and r["run"] != base
                    and against["ratio"] is not None):
                against.update(verdict=SAME_PLANS, text=_alike_text(against, base))
        if c["best"] in alike and c["second"] in alike and c["best_vs_second"]:
            c["significantly_best"] = False
            c["best_text"] = ("best by its point estimate; "
                              + _alike_text(c["best_vs_second"], c["second"]))
    runs = ", ".join(alike[:-1]) + f" and {alike[-1]}"
    return (f"{runs} held no work back (no request waited for a batch place or a KV slot, "
            f"none was left out of a step, no prompt was cut): every request ran at the first "
            f"step it could, so their policies planned the same steps, and what differs between "
            f"them ('same plans') is the machine's, run to run, not the policies'. Raise the load "
            f"(--rate) until the server holds work back to tell them apart.")
