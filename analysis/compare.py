"""Runs side by side, typically one per batching policy on the same seeded workload: the table of
throughput, goodput, latency percentiles and the server's batching figures; then, per metric,
which run is best and each run against a baseline run as a ratio with a bootstrap confidence
interval, or "no significant difference" where the interval holds 1 (estimates in
analysis/confidence.py), as tables, compare.md and a figure, compare.png. Runs whose workloads or
servers differ are still compared, with a warning naming each setting; goodput judged against
different SLOs is not.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from analysis import bootstrap
from analysis.arguments import number
from analysis.confidence import METRICS, MIN_BEYOND, analyse, slos
from analysis.over_runs import OverRuns, over_runs, over_runs_markdown, over_runs_text
from analysis.policy_choice import SAME_PLANS, held_back, mark_same_plans
from analysis.readers.files import RunDirError
from analysis.readers.latency import stats_ms
from analysis.readers.rundir import Run, load_run
from analysis.readers.server_metrics import server_side
from analysis.readers.server_stats import server_view
from analysis.report.scraped import headline_figures
from analysis.slo_claims import runs_lines
from analysis.tables import fmt_ms, fmt_num, markdown_table, text_table
from records.declare import compared_names, flat
from records.jsonform import dumps
from records.load_settings import LoadSettings, SloSettings
from records.server_settings import ServerSettings

HEADER = ["run", "policy", "out tok/s", "goodput req/s", "TTFT p50", "TTFT p99", "TPOT p50",
          "TPOT p99", "batch", "experts/step", "padded %", "held back"]
COMPARE_MD, COMPARE_PNG, COMPARE_JSON = "compare.md", "compare.png", "compare.json"
HELD_BACK = ("the server's plans that left work out (a request kept waiting, one not run, a "
             "prompt cut), where a policy chooses; 0: it had nothing to choose")
# the server side from each run's scraped /metrics (analysis/report/scraped.py), where any has it
SCRAPED_HEADER = ["run", "engine", "waiting mean", "waiting max", "KV mean", "KV max",
                  "preempt/min", "prefix hits", "balance", "server TTFT", "client - server",
                  "J/token"]
# Settings whose values must match for two runs to measure the same thing, as their declarations
# mark them (records/): the workload's (SLOs are checked for goodput on their own), and the server's
# but for the policy and its knobs, which differ by design.
WORKLOAD_KEYS = tuple(compared_names(LoadSettings))
SERVER_KEYS = tuple(compared_names(ServerSettings))


def figures(run: Run) -> dict:
    """The numbers of one row, None where the run has none."""
    ttft, tpot = stats_ms(run.histograms.get("ttft")), stats_ms(run.histograms.get("tpot"))
    throughput = run.summary.throughput
    view = server_view(run.summary.server)
    return {
        "run": run.path.name,
        "policy": view.policy if view else None,
        "output_tokens_per_s": throughput.output_tokens_per_s,
        "goodput_requests_per_s": throughput.goodput_requests_per_s,
        "ttft_p50_ms": ttft and ttft.p50, "ttft_p99_ms": ttft and ttft.p99,
        "tpot_p50_ms": tpot and tpot.p50, "tpot_p99_ms": tpot and tpot.p99,
        "mean_batch_size": view.mean_batch_size if view else None,
        "distinct_experts_per_step": view.distinct_experts_per_step if view else None,
        "prefill_padded_share": view.prefill_padded_share if view else None,
        "failed": run.summary.requests.failed,
        "plans_held_back": held_back(run.summary.server, view),
        "server_metrics": headline_figures(server_side(run), run),
    }


def _scraped_cells(f: dict) -> list[str]:
    s = f["server_metrics"] or {}

    def share(key: str) -> str:
        return "-" if s.get(key) is None else f"{100 * s[key]:.1f}%"

    return [f["run"], s.get("engine") or "-", fmt_num(s.get("waiting_mean"), ".1f"),
            fmt_num(s.get("waiting_max"), ".0f"), share("kv_usage_mean"), share("kv_usage_max"),
            fmt_num(s.get("preemptions_per_min"), ".3g"), share("prefix_hit_rate"),
            fmt_num(s.get("expert_balance"), ".3f"), fmt_ms(s.get("server_ttft_mean_ms")),
            fmt_ms(s.get("client_minus_server_ttft_ms"), "+"),
            fmt_num(s.get("joules_per_output_token"), ".3g")]


def _cells(f: dict) -> list[str]:
    share = f["prefill_padded_share"]
    return [f["run"], f["policy"] or "-", fmt_num(f["output_tokens_per_s"], ".1f"),
            fmt_num(f["goodput_requests_per_s"], ".2f"), fmt_ms(f["ttft_p50_ms"]),
            fmt_ms(f["ttft_p99_ms"]), fmt_ms(f["tpot_p50_ms"]), fmt_ms(f["tpot_p99_ms"]),
            fmt_num(f["mean_batch_size"], ".2f"), fmt_num(f["distinct_experts_per_step"], ".2f"),
            fmt_num(None if share is None else 100 * share, ".1f"),
            fmt_num(f["plans_held_back"], "d")]


def _objectives(slo: SloSettings) -> str:
    """TTFT <= 2000 ms and TPOT <= 200 ms; "" when none is set."""
    limits = {"TTFT": slo.slo_ttft_ms, "TPOT": slo.slo_tpot_ms, "E2E": slo.slo_e2e_ms}
    return " and ".join(f"{label} <= {ms:g} ms" for label, ms in limits.items() if ms is not None)


def slo_line(names: list[str], runs: list[Run]) -> str:
    per_run = [slos(r) for r in runs]
    if len(set(per_run)) != 1:
        each = "; ".join(f"{n}: {_objectives(slo) or 'none'}"
                         for n, slo in zip(names, per_run, strict=True))
        return f"goodput: the runs used different SLOs ({each}), so their goodput is not compared"
    objectives = _objectives(per_run[0])
    return f"goodput: requests/s meeting {objectives}" if objectives else \
        "goodput: no SLO was set, so it equals the ok requests/s"


def differences(names: list[str], settings: list[dict], keys: tuple[str, ...]) -> list[str]:
    """One line per key whose value the runs do not share, naming each run's value."""
    lines = []
    for key in keys:
        values = [s.get(key) for s in settings]
        if any(v != values[0] for v in values):
            lines.append(f"{key}: "
                         + ", ".join(f"{n}={v}" for n, v in zip(names, values, strict=True)))
    return lines


def setting_warnings(names: list[str], runs: list[Run]) -> list[str]:
    """Workload and server settings the runs do not share: the comparison then mixes them with
    the policy."""
    workload = differences(names, [flat(r.summary.config) for r in runs], WORKLOAD_KEYS)
    # Runs without a GetStats snapshot are left out, and settings some server did not report.
    snapshots = [(n, r.summary.server.latest) for n, r in zip(names, runs, strict=True)]
    known = [(n, snap.reported_settings()) for n, snap in snapshots if snap is not None]
    shared = [key for key in SERVER_KEYS if all(key in s for _, s in known)]
    server = (differences([n for n, _ in known], [s for _, s in known], tuple(shared))
              if len(known) > 1 else [])
    return [f"the workloads differ, so the comparison mixes workload and policy: {line}"
            for line in workload] + \
        [f"the servers differ, so the comparison mixes server settings and policy: {line}"
         for line in server]


# --- output ---

def confidence_rows(comparisons: dict[str, dict]) -> list[list[str]]:
    rows = []
    for metric in METRICS:
        c = comparisons[metric.key]
        for i, r in enumerate(c["runs"]):
            ci = (f"[{fmt_ms(r['ci'][0])}, {fmt_ms(r['ci'][1])}]" + " ~" * r["rough_interval"]
                  if r["ci"] else r["no_interval"] or "-")
            best = ("best" + (" *" if c["significantly_best"] else "") if r["run"] == c["best"]
                    else "")
            rows.append([f"{metric.label} ({metric.unit})" if i == 0 else "", r["run"],
                         fmt_ms(r["value"]), ci, best, r["vs_baseline"]["text"]])
    return rows


def notes(comparisons: dict[str, dict]) -> list[str]:
    return [f"{r['run']}, {c['label']}: {note}"
            for c in comparisons.values() for r in c["runs"] for note in r["notes"]]


def plot_comparison(comparisons: dict[str, dict], baseline: str, confidence: float,
                    path: Path) -> None:
    """One panel per metric: each run's value as a bar with its own interval, coloured by the
    verdict against the baseline, the ratio written beside it."""
    colours = {"baseline": "tab:blue", "better": "tab:green", "worse": "tab:red",
               bootstrap.SAME: "tab:gray", SAME_PLANS: "silver", None: "lightgray"}
    fig = Figure(figsize=(16, 8), dpi=100, layout="constrained")
    for ax, metric in zip(fig.subplots(2, 4).flat, METRICS, strict=True):
        runs = comparisons[metric.key]["runs"]
        y = np.arange(len(runs))
        values = [r["value"] or 0.0 for r in runs]
        # a rough interval (too few samples past the percentile): hatched, and "~" by its ratio
        ax.barh(y, values, color=[colours[r["vs_baseline"]["verdict"]] for r in runs],
                hatch=["//" if r["rough_interval"] else "" for r in runs], edgecolor="white")
        right = max([*values, *(r["ci"][1] for r in runs
                                if r["ci"] and math.isfinite(r["ci"][1]))], default=0) or 1
        for yi, r, value in zip(y, runs, values, strict=True):
            if r["ci"]:
                ax.plot(r["ci"], [yi, yi], color="black", marker="|", markersize=10)
            ratio = r["vs_baseline"]["ratio"]
            label = "" if r["run"] == baseline or ratio is None else bootstrap.fmt_ratio(ratio)
            label += " ~ rough" if r["rough_interval"] else ""
            ax.text(max(value, r["ci"][1] if r["ci"] else 0) + 0.02 * right, yi, label,
                    va="center", fontsize="small")
        ax.set_yticks(y, [r["run"] for r in runs])
        ax.invert_yaxis()
        ax.set_xlim(0, 1.3 * right)
        ax.set_xlabel(metric.unit)
        ax.set_title(f"{metric.label} "
                     f"({'lower' if metric.lower_is_better else 'higher'} is better)")
        ax.grid(True, axis="x", alpha=0.3)
    names = {"baseline": f"baseline ({baseline})", "better": "better", "worse": "worse",
             bootstrap.SAME: "no significant difference",
             SAME_PLANS: "same plans (no work held back)", None: "no verdict"}
    rough = Patch(facecolor="lightgray", hatch="//", edgecolor="white",
                  label="~ rough: few samples beyond the percentile")
    fig.legend(handles=[Patch(color=colours[k], label=label) for k, label in names.items()]
               + [rough], loc="outside lower center", ncols=7)
    fig.suptitle(f"Runs against {baseline}: value, {confidence:.0%} bootstrap interval "
                 "(whiskers), ratio to baseline")
    fig.savefig(path)


@dataclass(frozen=True)
class Draws:
    """The bootstrap behind every interval: its confidence, its resamples and their seed."""

    confidence: float = 0.95
    resamples: int = 2000
    seed: int = 0


@dataclass(frozen=True)
class Comparison:
    """What compare.md, the printed text and compare.json say, worked out once."""

    names: list[str]
    baseline: int
    draws: Draws
    rows: list[dict]  # each run's figures
    comparisons: dict[str, dict]  # per metric (analysis/confidence.py)
    alike: str  # the note on runs that held nothing back ("" when none)
    note: str  # the SLO line
    warnings: list[str]
    scraped: list[list[str]]  # the server side's cells, for runs that scraped /metrics
    judged: list[str]  # each run's objectives
    repeated: OverRuns | None  # run-to-run intervals and the recommendation, with --runs
    extra: list[str]  # notes on the estimates

    @property
    def ci_header(self) -> list[str]:
        return ["metric", "run", "value", f"{self.draws.confidence:.0%} interval", "best",
                f"vs {self.names[self.baseline]}"]

    @property
    def best_rows(self) -> list[list[str]]:
        return [[c["label"], c["best"] or "-", c["best_text"]] for c in self.comparisons.values()]

    @property
    def how(self) -> str:
        d = self.draws
        return (f"{d.confidence:.0%} bootstrap intervals, {d.resamples} resamples, seed {d.seed}: "
                f"latency percentiles over the measured requests (point estimates from the HDR "
                f"histograms; percentile = the k-th smallest, k = round(q n / 100), as HDR "
                f"counts), rates over the measured window's intervals; 'best *': significantly "
                f"better than the second best; a ratio is run / {self.names[self.baseline]}; "
                f"'~': fewer than {MIN_BEYOND} values beyond the percentile, so its interval (and "
                f"any verdict on it) is rough")


ROUND_ONE = ("each configuration's first run, with intervals from within that run; the "
             "verdicts and the recommendation stand on every run, over runs")
SCRAPED_NOTE = ("server side from each run's scraped /metrics (server_metrics.jsonl): KV-cache "
                "usage, preemptions per minute, the prefix-cache hit rate, expert balancedness, "
                "the server's mean TTFT and what the client waited beyond it, ms; '-': not "
                "exposed")


def comparison(runs: list[Run], baseline: int, draws: Draws,
               groups: list[list[Run]] | None, aa: int | None = None) -> Comparison:
    """The runs against the baseline run; groups: each configuration's repeat runs (runs: their
    first ones), for the run-to-run intervals and the recommendation; aa: the configuration that
    copies the baseline's."""
    names = run_names(runs)
    rows = [figures(r) | {"run": n} for r, n in zip(runs, names, strict=True)]
    comparisons = analyse(runs, names, baseline, draws.confidence, draws.resamples, draws.seed)
    alike = mark_same_plans(comparisons, names, [f["plans_held_back"] for f in rows], baseline)
    return Comparison(names, baseline, draws, rows, comparisons, alike, slo_line(names, runs),
                      setting_warnings(names, runs),
                      [_scraped_cells(f) for f in rows if f["server_metrics"]],
                      runs_lines(names, runs),
                      over_runs(groups, baseline, draws.confidence, aa) if groups else None,
                      notes(comparisons))


def comparison_text(c: Comparison) -> str:
    sections = ([f"round 1 of each ({ROUND_ONE}):"] if c.repeated else []) + [
                text_table(HEADER, [_cells(f) for f in c.rows]),
                c.note + "\nlatency in ms; held back: " + HELD_BACK,
                *([c.alike] if c.alike else []),
                *([text_table(SCRAPED_HEADER, c.scraped), SCRAPED_NOTE] if c.scraped else []),
                text_table(c.ci_header, confidence_rows(c.comparisons)),
                text_table(["metric", "best", "against the second best"], c.best_rows), c.how]
    sections += ["\n".join(f"objectives: {line}" for line in c.judged)] if c.judged else []
    sections += ["\n".join(f"note: {n}" for n in c.extra)] if c.extra else []
    sections += ["\n".join(f"warning: {w}" for w in c.warnings)] if c.warnings else []
    sections += [over_runs_text(c.repeated)] if c.repeated else []
    return "\n\n".join(sections)


def comparison_markdown(c: Comparison) -> str:
    return "\n\n".join([
        "# Comparison", *(f"**Warning:** {w}" for w in c.warnings),
        *(over_runs_markdown(c.repeated) if c.repeated else []),
        *([f"## Round 1 of each ({ROUND_ONE})"] if c.repeated else []),
        markdown_table(HEADER, [_cells(f) for f in c.rows]),
        c.note + "; latency in ms; experts/step: distinct experts a step activated, mean over "
        "layers; padded %: padding in batched prefill attention; held back: " + HELD_BACK + ".",
        *([f"**Same plans.** {c.alike}"] if c.alike else []),
        *(["## Server side (scraped)", markdown_table(SCRAPED_HEADER, c.scraped),
           SCRAPED_NOTE + "."] if c.scraped else []),
        f"## Against {c.names[c.baseline]}",
        markdown_table(c.ci_header, confidence_rows(c.comparisons)),
        *(["## Objectives (MLPerf's server-scenario verdict)",
           "\n".join(f"- {line}" for line in c.judged)] if c.judged else []),
        "## Best per metric",
        markdown_table(["metric", "best", "against the second best"], c.best_rows),
        c.how + ". Each interval holds at its confidence on its own: over many comparisons a "
        "few 'significant' ones are expected by chance.",
        *(f"- {n}" for n in c.extra), f"![comparison]({COMPARE_PNG})"]) + "\n"


def compare(runs: list[Run], out_dir: Path, baseline: int = 0, draws: Draws = Draws(),
            groups: list[list[Run]] | None = None, aa: int | None = None) -> tuple[str, dict]:
    """Prints nothing; writes compare.md and compare.png to out_dir; returns the text and the
    headline. groups: each configuration's repeat runs (runs: their first ones), for the
    run-to-run intervals."""
    c = comparison(runs, baseline, draws, groups, aa)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / COMPARE_MD).write_text(comparison_markdown(c))
    plot_comparison(c.comparisons, c.names[baseline], draws.confidence, out_dir / COMPARE_PNG)
    headline = {"compare_md": str(out_dir / COMPARE_MD), "compare_png": str(out_dir / COMPARE_PNG),
                "compare_json": str(out_dir / COMPARE_JSON), "runs": c.rows,
                "baseline": c.names[baseline], "confidence": draws.confidence,
                "resamples": draws.resamples, "seed": draws.seed, "warnings": c.warnings,
                "comparisons": c.comparisons} | (c.repeated.as_json() if c.repeated else {})
    return comparison_text(c), headline


def run_names(runs: list[Run]) -> list[str]:
    """Directory names, or the paths where two runs share a name."""
    names = [r.path.name for r in runs]
    return names if len(set(names)) == len(names) else [str(r.path) for r in runs]


def run_index(runs: list[Run], names: list[str], wanted: str) -> int | None:
    """Which run a flag names (its directory as given, its path or its name); None when none."""
    for i, (run, name) in enumerate(zip(runs, names, strict=True)):
        if (wanted in (name, run.path.name, str(run.path))
                or Path(wanted).resolve() == run.path.resolve()):
            return i
    return None


def add_command(commands) -> None:
    parser = commands.add_parser(
        "compare", help="runs side by side (e.g. one per batching policy), with bootstrap "
                        "confidence intervals against a baseline run")
    parser.add_argument("run_dirs", nargs="*", help="run directories")
    parser.add_argument("--runs", action="append", default=[], metavar="DIR,DIR,...",
                        help="one configuration's repeat runs, comma-separated; give it per "
                        "configuration (runs of two run interleaved, A B A B: their paired "
                        "difference too) for run-to-run intervals beside the within-run ones")
    parser.add_argument("--out", help="where compare.md and compare.png go (default: the runs' "
                        "common parent)")
    parser.add_argument("--baseline", help="run every other is compared with, by directory or name "
                        "(default: the first)")
    parser.add_argument("--aa", metavar="DIR", help="with --runs: the configuration (by its first "
                        "run) that repeats the baseline's configuration, run interleaved with "
                        "the others: the A/A pair that checks the intervals; if it is told apart "
                        "from the baseline, nothing is recommended")
    parser.add_argument("--confidence", type=number(float, 0, high=1, high_strict=True),
                        default=0.95, help="of the intervals (default 0.95)")
    parser.add_argument("--resamples", type=number(int, 100, strict=False), default=2000,
                        help="bootstrap draws (default 2000)")
    parser.add_argument("--seed", type=number(int, 0, strict=False), default=0,
                        help="of the bootstrap draws (default 0)")
    parser.set_defaults(func=main, parser=parser)


def main(args: argparse.Namespace) -> None:
    if bool(args.run_dirs) == bool(args.runs):
        args.parser.error("give run directories, or --runs per configuration, not both")
    groups = [[load_run(d) for d in group.split(",") if d] for group in args.runs] or None
    if groups and min(map(len, groups)) < 2:
        args.parser.error("--runs: each configuration needs at least two runs")
    runs = [g[0] for g in groups] if groups else [load_run(d) for d in args.run_dirs]
    baseline = 0 if args.baseline is None else run_index(runs, run_names(runs), args.baseline)
    if baseline is None:
        args.parser.error(f"--baseline {args.baseline!r} is none of the run directories given")
    aa = None if args.aa is None else run_index(runs, run_names(runs), args.aa)
    if args.aa is not None and (not groups or aa is None or aa == baseline):
        args.parser.error(f"--aa {args.aa!r}: name a configuration given with --runs, other "
                          "than the baseline, that repeats the baseline's configuration")
    out_dir = (Path(args.out) if args.out
               else Path(os.path.commonpath([r.path.resolve() for r in runs])))
    try:
        draws = Draws(args.confidence, args.resamples, args.seed)
        text, headline = compare(runs, out_dir, baseline, draws, groups, aa)
        (out_dir / COMPARE_JSON).write_text(dumps(headline) + "\n")
    except OSError as e:
        raise RunDirError(f"cannot write the comparison: {e}") from None
    print(text)
    print(f"\ncompare: {out_dir / COMPARE_MD}")
    print(dumps(short(headline)))


def short(headline: dict) -> dict:
    """The last line printed: where everything is, and the verdicts that are significant (the
    whole figures are in compare.json): over runs where there are repeats (and the
    recommendation), else within each run."""
    keys = ("compare_md", "compare_png", "compare_json", "baseline", "warnings")
    if "over_runs" in headline:
        return {key: headline[key] for key in keys} | {
            "recommendation": headline["recommendation"]["policy"],
            "significant": headline["over_runs"]["significant"]}
    significant = {f"{run['run']} {metric}": run["vs_baseline"]["verdict"]
                   + (" (rough)" if run["rough_interval"] else "")
                   for metric, c in headline["comparisons"].items() for run in c["runs"]
                   if run.get("vs_baseline") and run["vs_baseline"]["verdict"]
                   not in (None, bootstrap.SAME, SAME_PLANS, "baseline")}
    return {key: headline[key] for key in keys} | {"significant": significant}
