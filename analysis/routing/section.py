"""The report's routed-experts section (a run with --routed-experts: any server that returned
them), and `analysis what-if RUN`: the load per layer and expert (routed_experts.png), the
hottest experts, the imbalance over the run beside the client's TTFT and TPOT, how much requests
share experts (analysis/routing/views.py), the engines' own expert statistics where the run holds
them (analysis/readers/expert_records.py), and what our batching and placement would do with this
routing (analysis/routing/what_if.py)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.plots.experts import plot_experts
from analysis.readers.expert_records import ExpertRecords, read_expert_records
from analysis.readers.routed_experts import Routing, read_routing
from analysis.readers.rundir import Run, RunDirError, load_run
from analysis.routing.views import Balance, RoutingView, view_of
from analysis.routing.what_if import MAX_WAIT_MS, Grouping, Placing, grouping, placing
from analysis.tables import fmt_ms, markdown_table
from records.jsonform import dumps

ROUTING_PNG = "routed_experts.png"
BATCH = 8  # the report's what-if batch (analysis what-if --max-batch-size for another)


@dataclass(frozen=True)
class RoutingReport:
    view: RoutingView | None  # None: no request's routing was read
    lacking: dict[str, int]
    grouping: Grouping | None
    placing: Placing | None
    records: ExpertRecords | None
    expert_bytes: int = 0


def default_ranks(experts: int) -> int:
    return next((n for n in (8, 4, 2) if experts % n == 0), 1)


def step_ms_of(run: Run, routing: Routing) -> float:
    """A decode step's time: the measured requests' median TPOT, else the median time a
    routed request took per output token."""
    tpot = [row.tpot_ms for row in run.rows if row.measured_ok and row.tpot_ms is not None]
    if tpot:
        return float(np.median(tpot))
    per_token = [(r.finish_ms - r.sent_ms) / max(r.output_tokens, 1) for r in routing.rows
                 if r.finish_ms is not None and r.sent_ms is not None]
    return float(np.median(per_token)) if per_token else 1.0


def routing_report(run: Run, batch: int = BATCH, ranks: int = 0, redundant: int = -1,
                   expert_bytes: int = 0, max_wait_ms: float = MAX_WAIT_MS
                   ) -> RoutingReport | None:
    """None when the run holds neither routed experts nor an engine's expert statistics.
    ranks: the GPUs the experts are placed on (0: 8, 4 or 2); given, the balance is over
    them, else over the experts."""
    routing, records = read_routing(run.path), read_expert_records(run.path)
    if routing is None and records is None:
        return None
    if routing is None or not routing.requests:
        lacking = dict(routing.lacking) if routing is not None else {}
        return RoutingReport(None, lacking, None, None, records, expert_bytes)
    placed_on = ranks or default_ranks(routing.experts)
    redundant = placed_on if redundant < 0 else redundant
    try:
        view = view_of(routing, run.rows, ranks)
        placed = placing(routing, placed_on, redundant) if placed_on > 1 else None
    except ValueError as exc:  # ranks or replicas that do not divide: the flag's fault
        raise RunDirError(f"--ep-ranks/--redundant: {exc}") from None
    return RoutingReport(view, dict(routing.lacking),
                         grouping(routing, batch, step_ms_of(run, routing), max_wait_ms), placed,
                         records, expert_bytes)


def draw_routing(report: RoutingReport, path: Path) -> None:
    plot_experts(report.view.load, None, path)


def _balance(b: Balance) -> str:
    return (f"hottest/mean {b.hot_over_mean:.2f} (balancedness {b.balancedness:.3f}, "
            f"imbalance ratio {b.imbalance_ratio:.2f})")


def routing_lines(r: RoutingReport) -> list[str]:
    """The section as lines of text, shared by the report and what-if."""
    lines = []
    if r.view is not None:
        v, routing = r.view, r.view.routing
        over = ("experts" if v.ranks == routing.experts
                else f"{v.ranks} ranks of consecutive experts")
        counted = (f"{len(routing.measured())} measured" if v.measured_only
                   else "none after the warm-up: all counted")
        lines.append(f"routed experts of {routing.requests} requests ({counted}), "
                     f"{routing.layers} layers x {routing.experts} experts, top-{routing.top_k}; "
                     f"load over the {over}: {_balance(v.balance)}")
        lines.append("hottest experts by layer: " + "; ".join(
            f"L{layer} " + ", ".join(f"e{e} {share:.1%}" for e, share in hot)
            for layer, hot in enumerate(v.hot)))
        if v.affinity is not None:
            a = v.affinity
            lines.append(f"affinity: a request's output uses {a.experts_per_request:.1f} experts "
                         f"a layer; two requests share {a.shared:.1%} of theirs (Jaccard; "
                         f"about {a.shared_if_random:.1%} for random sets of those sizes)")
    for reason, n in sorted(r.lacking.items(), key=lambda item: -item[1]):
        lines.append(f"without routing: {n} requests: {reason}")
    if r.grouping is not None:
        lines.append(_grouping_line(r.grouping, r.view.routing, r.expert_bytes))
    if r.placing is not None:
        p = r.placing
        lines.append(f"what-if placement on {p.ranks} ranks: the hottest rank carries "
                     f"{p.contiguous:.2f}x the mean with contiguous placement, {p.balanced:.2f}x "
                     f"with balanced placement and {p.redundant} redundant experts (planned on "
                     "the first half of the requests, measured on the second)")
    if r.records is not None:
        lines += r.records.lines()
    return lines


def _grouping_line(g: Grouping, routing: Routing, expert_bytes: int) -> str:
    if not g.steps_with_choice:
        return (f"what-if grouping: at most {g.max_in_flight} requests were in flight in the "
                f"{g.steps} decode steps replayed ({fmt_ms(g.step_ms)} ms a step), never more "
                f"than a batch of {g.batch}: fcfs and expert_aware run the same batches, "
                f"{g.fcfs_all:.2f} distinct experts a layer a step (a higher load, or a "
                "smaller --max-batch-size, gives expert_aware a choice)")
    cut = 1 - g.expert_aware / g.fcfs if g.fcfs else 0.0
    text = (f"what-if grouping at a batch of {g.batch}: expert_aware would cut distinct experts "
            f"per decode step from {g.fcfs:.2f} to {g.expert_aware:.2f} a layer ({cut:.1%}) over "
            f"the {g.steps_with_choice} of {g.steps} steps with more in flight than a batch "
            f"(a step: {fmt_ms(g.step_ms)} ms)")
    if expert_bytes:
        per_step = lambda d: d * routing.layers * expert_bytes / 2**20  # noqa: E731
        text += (f"; expert weights read per step {per_step(g.fcfs):.1f} -> "
                 f"{per_step(g.expert_aware):.1f} MiB")
    return text


def routing_markdown(r: RoutingReport) -> list[str]:
    parts = ["## Routed experts (from the server's replies)", "\n".join(
        f"- {line}" for line in routing_lines(r))]
    if r.view is not None:
        parts.append(f"![routed experts]({ROUTING_PNG})")
        rows = [[f"{m.end_s:.1f}", str(m.requests), f"{m.balance.hot_over_mean:.2f}",
                 f"{m.balance.balancedness:.3f}", f"{m.balance.imbalance_ratio:.2f}",
                 fmt_ms(m.ttft_p50_ms), fmt_ms(m.tpot_p50_ms)] for m in r.view.moments]
        if rows:
            parts += ["### Imbalance over time, beside the client's latency",
                      markdown_table(["until s", "requests", "hottest/mean", "balancedness",
                                      "imbalance ratio", "TTFT p50 ms", "TPOT p50 ms"], rows)]
    return parts


def add_command(commands) -> None:
    parser = commands.add_parser(
        "what-if", help="what expert-aware batching and balanced placement would do with a "
        "run's routed experts")
    parser.add_argument("run_dir", help="a run directory with routed_experts.jsonl")
    parser.add_argument("--max-batch-size", type=int, default=BATCH,
                        help="requests a decode step runs (default %(default)s)")
    parser.add_argument("--ep-ranks", type=int, default=0,
                        help="GPUs the experts are placed on (default: 8, 4 or 2, the first "
                        "that divides the experts)")
    parser.add_argument("--redundant", type=int, default=-1,
                        help="extra expert replicas of balanced placement (default: one a rank)")
    parser.add_argument("--max-wait-ms", type=float, default=MAX_WAIT_MS,
                        help="expert_aware runs a request not picked this long first (default: "
                        "the lab server's, %(default)s)")
    parser.add_argument("--expert-bytes", type=int, default=0,
                        help="bytes of one expert's weights, for the bytes read per step")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> None:
    for flag, low in (("max_batch_size", 1), ("ep_ranks", 0), ("expert_bytes", 0),
                      ("redundant", -1), ("max_wait_ms", 0)):
        if getattr(args, flag) < low:
            raise RunDirError(f"--{flag.replace('_', '-')}: must be at least {low}, got "
                              f"{getattr(args, flag)}")
    run = load_run(args.run_dir)
    report = routing_report(run, args.max_batch_size, args.ep_ranks, args.redundant,
                            args.expert_bytes, args.max_wait_ms)
    if report is None or report.view is None:
        raise RunDirError(f"{args.run_dir}: no routed experts to replay (run with "
                          "--routed-experts on against a server that returns them)")
    print("\n".join(routing_lines(report)))
    print(dumps(what_if_figures(run, report)))


def what_if_figures(run: Run, r: RoutingReport) -> dict:
    """The what-if's last line: what it replayed and what each plan did."""
    v, g, p = r.view, r.grouping, r.placing
    figures = {"run_dir": str(run.path), "requests": v.routing.requests,
               "layers": v.routing.layers, "experts": v.routing.experts,
               "top_k": v.routing.top_k, "hot_over_mean": v.balance.hot_over_mean,
               "balancedness": v.balance.balancedness}
    if g is not None:
        figures["grouping"] = {"batch": g.batch, "step_ms": g.step_ms, "steps": g.steps,
                               "max_in_flight": g.max_in_flight,
                               "steps_with_choice": g.steps_with_choice,
                               "fcfs_experts": g.fcfs if g.steps_with_choice else g.fcfs_all,
                               "expert_aware_experts": (g.expert_aware if g.steps_with_choice
                                                        else g.fcfs_all)}
    if p is not None:
        figures["placement"] = {"ranks": p.ranks, "redundant": p.redundant,
                                "contiguous_hot_over_mean": p.contiguous,
                                "balanced_hot_over_mean": p.balanced}
    return figures
