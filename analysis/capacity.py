"""Expert capacity planning, from a run's measured per-expert loads or from \
given numbers.

capacity = tokens x k / (experts x target utilisation): the slots per expert per step that
keep an average expert at the target utilisation. The seed advises 1.5-2x the average
load (utilisation 0.5-0.67) to absorb bursts. The server's capacity factor is the inverse
view: capacity = ceil(tokens x k / experts x CF), so CF = 1 / target utilisation.

For each capacity factor, the share of (token, expert) pairs the measured load would have
dropped. A run's GetStats snapshots give, per interval, each layer's pairs per expert and the
steps taken; the estimate puts every step of an interval at the interval's mean tokens per
step with each expert at its interval share (ASSUMPTION below says what that misses). The
lower bound holds whatever the steps were: a step's capacity ceil(x) is under x + 1, so an
interval drops at least routed - steps x (mean tokens x k / experts x CF + 1) of an expert's pairs.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.arguments import number, numbers
from analysis.readers.files import RunDirError
from analysis.readers.rundir import load_run
from analysis.readers.samples import expert_intervals
from analysis.readers.server_stats import expert_shares
from analysis.tables import markdown_table, text_table
from records.jsonform import dumps
from records.rundir import SAMPLES, SUMMARY
from records.server_stats import ServerSample, ServerStats

CAPACITY_MD = "capacity.md"
BURSTS = (1.5, 2.0)  # the seed's headroom over the average load
ASSUMPTION = ("the estimate puts every step of an interval at the interval's mean tokens per "
              "step, each expert at its interval share of the pairs. Step-to-step variation of "
              "the shares only adds drops, so it tends low; steps smaller than the mean get "
              "relatively more slots from rounding up (under one slot per expert per step), "
              "which the lower bound allows for.")
NUMBERS_ASSUMPTION = ("every step has exactly these tokens and each expert exactly its share of "
                      "the pairs; real steps vary, and variation of the shares only adds drops, "
                      "so this is a lower bound for them.")


def planned_capacity(tokens: float, top_k: int, n_experts: int, target_utilisation: float) -> float:
    """Slots per expert for one step of `tokens` tokens at the target utilisation (0, 1]."""
    if not 0 < target_utilisation <= 1:
        raise ValueError(f"target utilisation must be in (0, 1], got {target_utilisation}")
    if tokens < 0 or top_k < 1 or n_experts < 1:
        raise ValueError("tokens >= 0, top_k >= 1 and n_experts >= 1 are required")
    return tokens * top_k / (n_experts * target_utilisation)


def capacity_factor(target_utilisation: float) -> float:
    """The server's --capacity-factor that gives the same capacity."""
    return 1 / target_utilisation


def slots(tokens: float, top_k: int, n_experts: int, factor: float) -> int:
    """Slots per expert in a step of `tokens`, as the server computes them."""
    return math.ceil(tokens * top_k / n_experts * factor)


@dataclass(frozen=True)
class ExpertLoads:
    """Routed (token, expert) pairs per interval, layer and expert, and the steps of each
    interval."""

    top_k: int
    n_experts: int
    steps: np.ndarray  # [I]
    routed: np.ndarray  # [I, L, E] pairs, drops included
    dropped: np.ndarray  # [I, L, E] measured pairs over capacity (zeros when dropless)
    run_factor: float  # the capacity factor the run ran with; 0 = dropless
    basis: str
    # with --ep: [L, W] pairs each rank's experts computed over the intervals
    rank_pairs: np.ndarray | None = None

    @property
    def tokens(self) -> np.ndarray:
        """[I] tokens of each interval: every token takes k pairs in every layer."""
        return self.routed.sum(axis=2).mean(axis=1) / self.top_k

    @property
    def tokens_per_step(self) -> float:
        return float(self.tokens.sum() / self.steps.sum())


def load_from_numbers(tokens: int, top_k: int, n_experts: int,
                      shares: np.ndarray | None) -> ExpertLoads:
    """One step of `tokens` tokens, the pairs split by `shares` (uniform when None)."""
    shares = np.full(n_experts, 1 / n_experts) if shares is None else shares / shares.sum()
    routed = (shares * tokens * top_k)[None, None, :]
    return ExpertLoads(top_k, n_experts, np.ones(1), routed, np.zeros_like(routed), 0.0,
                       "given numbers")


def load_from_run(run_dir: Path) -> ExpertLoads:
    """From server_stats.jsonl's snapshots, or from summary.json's start and end snapshots
    without it."""
    run = load_run(run_dir)
    samples, source = run.samples, run_dir / SAMPLES
    start, end = (s if s is not None and s.ok else None
                  for s in (run.summary.server.start, run.summary.server.end))
    if len(samples) >= 2 and start is not None and _before(start, samples[0].stats):
        # the steps before the first sample
        samples = [ServerSample(t_unix_s=0.0, t_run_s=0.0, stats=start), *samples]
    elif len(samples) < 2:
        samples, source = [], run_dir / SUMMARY
        if start is not None and end is not None:
            samples = [ServerSample(t_unix_s=0.0, t_run_s=t, stats=s)
                       for t, s in ((0.0, start), (1.0, end))]
    intervals = [i for i in expert_intervals(samples) if i.steps > 0 and i.routed.sum() > 0]
    last = samples[-1].stats if samples else ServerStats()
    if not intervals:
        raise RunDirError(f"{source}: no per-layer expert loads over any interval (a server "
                          "without layer stats, or no steps)")
    if not last.top_k or not last.num_experts:
        raise RunDirError(f"{source}: the GetStats snapshots give no top_k or num_experts")
    shape = intervals[-1].routed.shape
    intervals = [i for i in intervals if i.routed.shape == shape]
    basis = (f"{SAMPLES}: {len(intervals)} intervals, the first from summary.json's start snapshot"
             if source.name == SAMPLES
             else f"{SUMMARY}: start and end snapshots (one interval, the whole run)")
    return ExpertLoads(last.top_k, last.num_experts,
                       np.asarray([i.steps for i in intervals], dtype=float),
                       np.stack([i.routed for i in intervals]),
                       np.stack([i.dropped for i in intervals]),
                       intervals[-1].capacity_factor, basis, _rank_pairs(last, samples[0].stats))


def _rank_pairs(last: ServerStats, first: ServerStats) -> np.ndarray | None:
    """[L, W] pairs each expert-parallel rank computed between two snapshots; None with one
    rank."""
    if not last.layers or not last.layers[0].rank_pairs:
        return None
    pairs = np.asarray([layer.rank_pairs for layer in last.layers], dtype=float)
    if first.layers and first.layers[0].rank_pairs:
        pairs -= np.asarray([layer.rank_pairs for layer in first.layers], dtype=float)
    return pairs if pairs.sum() else None


def _before(start: ServerStats, first: ServerStats) -> bool:
    """Whether summary.json's start snapshot was taken before the first sample, on the same
    counters."""
    return bool(start.layers) and start.uptime_s < first.uptime_s


def estimated_drops(load: ExpertLoads, factor: float, lower_bound: bool = False) -> np.ndarray:
    """[I, L, E] pairs over capacity at the interval's mean step; see the module docstring."""
    per_step = load.tokens / load.steps
    if lower_bound:
        capacity = per_step * load.top_k / load.n_experts * factor + 1
    else:
        capacity = np.ceil(per_step * load.top_k / load.n_experts * factor)
    return np.maximum(load.routed - (load.steps * capacity)[:, None, None], 0.0)


@dataclass(frozen=True)
class FactorRow:
    factor: float
    slots: int  # at the mean tokens per step
    drop_share: float  # estimate, all layers
    lower_bound: float
    worst_layer: int
    worst_layer_share: float
    worst_expert: int | None  # the expert with the most estimated drops in the worst layer
    measured: float | None  # the run's own drop share, where it ran with this factor


def factor_row(load: ExpertLoads, factor: float) -> FactorRow:
    drops = estimated_drops(load, factor)
    per_layer = drops.sum(axis=(0, 2)) / load.routed.sum(axis=(0, 2))
    worst = int(per_layer.argmax())
    by_expert = drops[:, worst].sum(axis=0)
    measured = None
    if load.run_factor > 0 and math.isclose(factor, load.run_factor):
        measured = float(load.dropped.sum() / load.routed.sum())
    return FactorRow(factor, slots(load.tokens_per_step, load.top_k, load.n_experts, factor),
                     float(drops.sum() / load.routed.sum()),
                     float(estimated_drops(load, factor, lower_bound=True).sum()
                           / load.routed.sum()),
                     worst, float(per_layer[worst]),
                     int(by_expert.argmax()) if by_expert.any() else None, measured)


@dataclass(frozen=True)
class Plan:
    load: ExpertLoads
    target_utilisation: float
    rows: list[FactorRow]
    from_run: bool

    @property
    def average_load(self) -> float:
        """(token, expert) pairs per expert per step at the mean tokens per step."""
        return self.load.tokens_per_step * self.load.top_k / self.load.n_experts

    @property
    def planned(self) -> float:
        return planned_capacity(self.load.tokens_per_step, self.load.top_k, self.load.n_experts,
                                self.target_utilisation)

    def hottest(self) -> tuple[int, int, float]:
        """(layer, expert, share of its layer's pairs) of the most loaded expert over the whole
        run."""
        shares = expert_shares(self.load.routed.sum(axis=0))  # [L, E]
        layer, expert = np.unravel_index(int(shares.argmax()), shares.shape)
        return int(layer), int(expert), float(shares[layer, expert])


def plan(load: ExpertLoads, target_utilisation: float, factors: list[float],
         from_run: bool) -> Plan:
    factors = sorted(set(factors) | ({load.run_factor} if load.run_factor > 0 else set()))
    return Plan(load, target_utilisation, [factor_row(load, f) for f in factors], from_run)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def table(p: Plan) -> tuple[list[str], list[list[str]]]:
    if p.from_run:
        header = ["CF", "slots/expert", "est. drop %", "lower bound %", "worst layer %",
                  "worst expert", "measured drop %"]
        rows = [[f"{r.factor:g}", str(r.slots), _pct(r.drop_share), _pct(r.lower_bound),
                 (f"{_pct(r.worst_layer_share)} (layer {r.worst_layer})" if r.worst_layer_share
                  else "0.00"),
                 ("-" if r.worst_expert is None
                  else f"layer {r.worst_layer} expert {r.worst_expert}"),
                 _pct(r.measured)] for r in p.rows]
        return header, rows
    header = ["CF", "slots/expert", "drop %", "worst expert"]
    return header, [[f"{r.factor:g}", str(r.slots), _pct(r.drop_share),
                     "-" if r.worst_expert is None else f"expert {r.worst_expert}"] for r in p.rows]


def summary_lines(p: Plan) -> list[str]:
    load, u = p.load, p.target_utilisation
    layers = load.routed.shape[1]
    lines = [f"{load.n_experts} experts, top-{load.top_k}"
             + (f", {layers} MoE layers" if p.from_run else "")
             + f"; {load.tokens_per_step:.2f} tokens per step"
             + (f" over {load.steps.sum():.0f} steps ({load.basis})" if p.from_run else ""),
             f"average load: {p.average_load:.2f} (token, expert) pairs per expert per step",
             f"capacity at {100 * u:g}% target utilisation: {p.planned:.2f} pairs per expert "
             f"per step ({math.ceil(p.planned - 1e-9)} slots, the server's --capacity-factor "
             f"{capacity_factor(u):g})",
             "burst headroom: " + ", ".join(
                 f"{b:g}x average = {b * p.average_load:.2f} "
                 f"({math.ceil(b * p.average_load - 1e-9)} slots)"
                 for b in BURSTS)]
    layer, expert, share = p.hottest()
    over = share * load.n_experts
    if p.from_run:
        lines.append(f"hottest expert over the run: layer {layer} expert {expert} takes "
                     f"{100 * share:.1f}% of its layer's pairs, {over:.2f}x the average; "
                     f"CF {over:.2f} would hold it if every step had the run's overall shares "
                     "(per interval they swing further: see the table)")
    else:
        lines.append(f"hottest expert: expert {expert} takes {100 * share:.1f}% of the pairs, "
                     f"{over:.2f}x the average: no drops needs CF >= {over:.2f}")
    if load.run_factor > 0:
        lines.append(f"the run ran with --capacity-factor {load.run_factor:g}: measured drops "
                     f"{_pct(float(load.dropped.sum() / load.routed.sum()))}% of the pairs")
    if load.rank_pairs is not None:
        lines.append(rank_line(p))
    return lines


def rank_line(p: Plan) -> str:
    """Per-rank expert capacity with the experts spread over ranks: every step waits for the
    rank whose experts computed the most pairs, so a rank is sized for that rank's load."""
    load = p.load
    ranks = load.rank_pairs.shape[1]
    steps = float(load.steps.sum())
    per_step = load.rank_pairs / steps  # [L, W]
    mean = load.tokens_per_step * load.top_k / ranks
    layer, rank = np.unravel_index(int(per_step.argmax()), per_step.shape)
    busiest = float(per_step[layer, rank])
    return (f"expert parallelism over {ranks} ranks: a rank's experts computed {mean:.2f} "
            f"pairs per step on average; the busiest, rank {rank} in layer {layer}, "
            f"{busiest:.2f} ({busiest / mean:.2f}x): at {100 * p.target_utilisation:g}% target "
            f"utilisation a rank needs capacity for {busiest / p.target_utilisation:.2f} pairs "
            f"per step ({load.n_experts // ranks} experts each, or fewer with replicas)")


def render_text(p: Plan, title: str) -> str:
    header, rows = table(p)
    assumption = ASSUMPTION if p.from_run else NUMBERS_ASSUMPTION
    return "\n".join([title, *summary_lines(p), "", text_table(header, rows),
                      f"assumes: {assumption}"])


def render_markdown(p: Plan, run_dir: Path) -> str:
    header, rows = table(p)
    return "\n\n".join([
        f"# Expert capacity: {run_dir.resolve().name}",
        "\n".join(f"- {line}" for line in summary_lines(p)),
        "## Drops by capacity factor", markdown_table(header, rows),
        "Slots per expert: ceil(tokens x k / experts x CF) at the run's mean tokens per step, "
        "as the server computes them. Drop %: share of the (token, expert) pairs over capacity, "
        "all layers; worst layer: the layer with the most; worst expert: the one with the most "
        "estimated drops in that layer.",
        f"Assumes: {ASSUMPTION}"]) + "\n"


def headline(p: Plan, md: Path | None) -> dict:
    layer, expert, share = p.hottest()
    return {"capacity_md": None if md is None else str(md),
            "tokens_per_step": p.load.tokens_per_step, "top_k": p.load.top_k,
            "experts": p.load.n_experts, "target_utilisation": p.target_utilisation,
            "average_load": p.average_load, "planned_capacity": p.planned,
            "burst_slots": {f"{b:g}x": math.ceil(b * p.average_load - 1e-9) for b in BURSTS},
            "hottest": {"layer": layer, "expert": expert, "share": share,
                        "over_mean": share * p.load.n_experts},
            "run_capacity_factor": p.load.run_factor or None,
            "factors": [{"capacity_factor": r.factor, "slots": r.slots, "drop_share": r.drop_share,
                         "drop_share_lower_bound": r.lower_bound if p.from_run else None,
                         "worst_layer": r.worst_layer,
                         "worst_layer_drop_share": r.worst_layer_share,
                         "worst_expert": r.worst_expert, "measured_drop_share": r.measured}
                        for r in p.rows]}


def add_command(commands) -> None:
    parser = commands.add_parser(
        "capacity",
        help="expert capacity planning: from a run's measured loads or from numbers",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", nargs="?",
                        help="run directory (or give --tokens, --top-k and --experts)")
    parser.add_argument("--target-utilisation", type=number(float, 0, high=1), default=0.8,
                        help="share of an expert's slots the average load should fill, in (0, 1] "
                             "(default 0.8)")
    parser.add_argument("--capacity-factors", type=numbers(low_ok=False),
                        default=[1.0, 1.25, 1.5, 2.0],
                        help="capacity factors to estimate drops at (default 1,1.25,1.5,2)")
    parser.add_argument("--tokens", type=number(int, 0), help="without a run: tokens per step")
    parser.add_argument("--top-k", type=number(int, 0), help="without a run: experts per token")
    parser.add_argument("--experts", type=number(int, 0), help="without a run: experts per layer")
    parser.add_argument("--loads", type=numbers(low_ok=True),
                        help="without a run: each expert's share of the pairs, normalised "
                             "(default uniform)")
    parser.set_defaults(func=main, error=parser.error)


def _numbers_load(args: argparse.Namespace) -> ExpertLoads:
    if args.tokens is None or args.top_k is None or (args.experts is None and args.loads is None):
        args.error("give RUN_DIR, or --tokens and --top-k with --experts or --loads")
    experts = args.experts if args.experts is not None else len(args.loads)
    shares = None
    if args.loads is not None:
        if len(args.loads) != experts:
            args.error(f"--loads: {len(args.loads)} shares for --experts {experts}")
        shares = np.asarray(args.loads) / sum(args.loads) if sum(args.loads) > 0 else None
        if shares is None:
            args.error("--loads: the shares add up to 0")
    if args.top_k > experts:
        args.error(f"--top-k {args.top_k} is more than --experts {experts}")
    if shares is not None and shares.max() > 1 / args.top_k + 1e-9:
        args.error(f"--loads: expert {int(shares.argmax())} has {shares.max():.3f} of the pairs, "
                   f"above 1/top-k = {1 / args.top_k:.3f}: a token takes k distinct experts")
    return load_from_numbers(args.tokens, args.top_k, experts, shares)


def main(args: argparse.Namespace) -> None:
    given = [flag for flag, value in (("--tokens", args.tokens), ("--top-k", args.top_k),
                                      ("--experts", args.experts), ("--loads", args.loads))
             if value is not None]
    if args.run_dir is None:
        p = plan(_numbers_load(args), args.target_utilisation, args.capacity_factors,
                 from_run=False)
        print(render_text(p, "capacity from given numbers"))
        print(dumps(headline(p, None)))
        return
    if given:
        args.error(f"{', '.join(given)}: give RUN_DIR or the numbers, not both")
    run_dir = Path(args.run_dir)
    p = plan(load_from_run(run_dir), args.target_utilisation, args.capacity_factors, from_run=True)
    print(render_text(p, f"capacity {run_dir}"))
    md = run_dir / CAPACITY_MD
    try:
        md.write_text(render_markdown(p, run_dir))
    except OSError as e:  # the message names the file
        raise RunDirError(f"cannot write the capacity plan: {e}") from None
    print(f"\ncapacity: {md}")
    print(dumps(headline(p, md)))
