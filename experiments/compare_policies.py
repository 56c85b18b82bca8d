"""`python -m experiments compare-policies` (`make compare`): which batching policy to pick for a
server, at the user's objectives, decided on repeat runs (docs/compare.md).

1. The load: --rate, or a share of what a quick stress of the baseline finds the server carries
   (experiments/load_choice.py), raised where needed for the plan to fit (at most 0.85 of it).
2. The plan: every policy and an A/A copy of the first, interleaved in rounds, each run long
   enough for its percentile objectives, within --budget-s (experiments/plan.py).
3. The runs, a fresh server each, printing progress (run k of n).
4. The judgement: `analysis compare --runs` over every configuration's runs, the A/A copy named
   as such (analysis/over_runs.py), written to compare.md and compare.json; the recommendation
   is printed last (null where no policy is distinguishable); the exit status is 1 where a
   request failed, 2 where the comparison could not be planned or a process failed."""

from __future__ import annotations

import argparse
import shlex
import shutil
import time
from pathlib import Path

from analysis.arguments import number
from analysis.compare import COMPARE_JSON, COMPARE_MD, COMPARE_PNG, compare
from analysis.readers.rundir import load_run
from experiments import load_choice
from experiments.plan import ComparisonPlan, DoesNotFit, least_rate, plan
from experiments.processes import ProcessError, locust, server
from records.jsonform import dumps

PLAN_JSON = "plan.json"
OWN = {PLAN_JSON, "stress", COMPARE_MD, COMPARE_JSON, COMPARE_PNG}
MOST_SHARE = 0.85  # of what the server carried: the highest load a budget may raise it to


def objectives(args: argparse.Namespace) -> list[str]:
    flags = ["--slo-percentile", f"{args.slo_percentile:g}"]
    for flag, value in (("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms)):
        flags += [flag, f"{value:g}"] if value else []
    return flags


def ours(entry: Path) -> bool:
    """Whether a folder's entry is one a comparison writes."""
    return entry.name in OWN or entry.name.startswith("round-")


def fresh(out: Path) -> None:
    """Empties out where it holds only what a comparison writes (one refused or stopped part-way
    too); refuses a folder holding anything else."""
    if out.exists() and any(out.iterdir()):
        strangers = sorted(e.name for e in out.iterdir() if not ours(e))
        if strangers:
            raise SystemExit(f"error: --out {out} holds files a comparison does not write "
                             f"({', '.join(strangers[:3])}); give an empty or new folder")
        shutil.rmtree(out)
    out.mkdir(parents=True)


def one_run(run, p: ComparisonPlan, args: argparse.Namespace, rate: float, out: Path) -> dict:
    run_dir = out / f"round-{run.round}" / run.config
    flags = [*shlex.split(args.server), "--policy", run.policy]
    load = ["-t", f"{p.warmup_s + p.measure_s:g}s", "--warmup-s", f"{p.warmup_s:g}",
            "--rate", f"{rate:g}", "--seed", str(run.seed), *shlex.split(args.load),
            *objectives(args)]
    with server(flags, run_dir) as host:
        return locust(host, run_dir, load, limit_s=p.warmup_s + p.measure_s + 120)


def progress(k: int, p: ComparisonPlan, run, headline: dict, started: float) -> str:
    def ms(key: str) -> str:
        return "-" if headline.get(key) is None else f"{headline[key]:.4g} ms"

    return (f"run {k} of {len(p.runs)} (round {run.round} of {p.rounds}): {run.config}: "
            f"{headline.get('ok', 0)} ok, {headline.get('failed', 0)} failed; TTFT p99 "
            f"{ms('ttft_p99_ms')}, TPOT p99 {ms('tpot_p99_ms')} "
            f"[{time.monotonic() - started:.0f} s]")


def judge(out: Path, p: ComparisonPlan, context: dict) -> tuple[str, dict]:
    names = [name for name, _ in p.configs]
    groups = [[load_run(out / f"round-{k}" / name) for k in range(1, p.rounds + 1)]
              for name in names]
    text, headline = compare([g[0] for g in groups], out, 0, groups=groups,
                             aa=names.index(p.aa))
    headline |= context
    (out / COMPARE_JSON).write_text(dumps(headline) + "\n")
    return text, headline


def the_load(args: argparse.Namespace, policies: list[str], out: Path,
             left_s) -> tuple[float, str, float | None]:
    """(rate, why, what the server carried where a stress found it); left_s() is the budget
    left. A found load too low for the plan to fit is raised to the least that fits, up to
    MOST_SHARE of what the server carried."""
    if args.rate:
        return args.rate, f"{args.rate:g} requests/s: given (--rate)", None
    print(f"finding the load: a quick stress of {policies[0]} ...", flush=True)
    choice = load_choice.choose([*shlex.split(args.server), "--policy", policies[0]],
                                [*shlex.split(args.load), *objectives(args)], out / "stress",
                                args.load_share)
    least = least_rate(policies, args.slo_percentile, args.repeats, left_s() - 1)
    if least <= choice.rate or least > MOST_SHARE * choice.carried:
        return choice.rate, choice.why, choice.carried  # fits, or the plan will say it cannot
    return least, (f"{least:g} requests/s ({least / choice.carried:.2f} x), the least at which "
                   f"{args.repeats} rounds fit --budget-s; {choice.why}"), choice.carried


def main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    out = Path(args.out)
    fresh(out)
    policies = args.policies.replace(",", " ").split()
    try:
        rate, why, carried = the_load(args, policies, out,
                                      lambda: args.budget_s - (time.monotonic() - started))
        print(f"load: {why}", flush=True)
        p = plan(policies, rate, args.slo_percentile, args.repeats, args.budget_s,
                 time.monotonic() - started)
    except (DoesNotFit, load_choice.NoLoad, ProcessError) as e:
        print(f"error: {e}")
        return 2
    print(f"plan: {p.text(rate)}", flush=True)
    context = {"load": {"rate": rate, "why": why, "carried": carried},
               "plan": {"runs": len(p.runs), "rounds": p.rounds, "measure_s": p.measure_s,
                        "warmup_s": p.warmup_s, "floor": p.floor, "aa": p.aa}}
    (out / PLAN_JSON).write_text(dumps(context) + "\n")
    failed = 0
    for k, run in enumerate(p.runs, 1):
        try:
            headline = one_run(run, p, args, rate, out)
        except ProcessError as e:
            print(f"error: run {k} of {len(p.runs)} ({run.config}, round {run.round}): {e}")
            return 2
        failed += headline.get("failed", 0)
        print(progress(k, p, run, headline, started), flush=True)
    text, headline = judge(out, p, context)
    print(text)
    print(f"\nload: {why}\ncompare: {out / COMPARE_MD} [{time.monotonic() - started:.0f} s]")
    print(f"recommendation: {headline['recommendation']['text']}")
    print(dumps({"compare_json": str(out / COMPARE_JSON),
                 "recommendation": headline["recommendation"]["policy"], "rate": rate,
                 "significant": headline["over_runs"]["significant"], "failed": failed}))
    return 1 if failed else 0


def add_command(commands) -> None:
    from server.scheduling.policies import POLICIES

    parser = commands.add_parser(
        "compare-policies", help="which batching policy to pick: every policy and an A/A pair "
        "run interleaved, judged over runs at your objectives")
    parser.add_argument("--policies", default=" ".join(POLICIES),
                        help="the policies, the baseline first (default: every one, fcfs first)")
    parser.add_argument("--server", default="--preset tiny",
                        help="the server's flags, but --policy and --port (quoted)")
    parser.add_argument("--load", default="", help="the workload's flags, but the rate, length, "
                        "seed and objectives (quoted): e.g. '--prompt-tokens 64 --max-tokens 32'")
    parser.add_argument("--rate", type=number(float, 0), default=0.0,
                        help="requests/s to compare at (default 0: a share of what a quick stress "
                        "finds the server carries)")
    parser.add_argument("--load-share", type=number(float, 0, high=1), default=0.7,
                        help="of what the server carries, where --rate is not given (default 0.7; "
                        "raised, up to 0.85, where a lower load's runs would not fit --budget-s)")
    parser.add_argument("--slo-ttft-ms", type=number(float, 0), default=500.0,
                        help="TTFT objective; goodput counts requests meeting every objective "
                        "(default 500; 0: none)")
    parser.add_argument("--slo-tpot-ms", type=number(float, 0), default=100.0,
                        help="TPOT objective (default 100; 0: none)")
    parser.add_argument("--slo-percentile", type=number(float, 50, high=100, high_strict=True),
                        default=99.0, help="of the objectives (default 99); sets how many "
                        "requests a run measures")
    parser.add_argument("--repeats", type=number(int, 2, strict=False), default=3,
                        help="rounds: each configuration's runs; more narrow the intervals over "
                        "runs and take longer (default 3)")
    parser.add_argument("--budget-s", type=number(float, 0), default=570.0,
                        help="the most the comparison may take; a plan that needs more is "
                        "refused, saying what would fit (default 570)")
    parser.add_argument("--out", default="runs/compare", help="the comparison's folder (default "
                        "runs/compare; an earlier comparison there is replaced)")
    parser.set_defaults(func=main)
