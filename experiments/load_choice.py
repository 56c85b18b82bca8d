"""The load a comparison runs at, where none is given: a quick stress of the baseline policy's
server (the offered rate x1.4 every 3 s from 1 request/s until a step saturates, judged
at the comparison's objectives) finds its knee, the highest rate that held; the comparison runs
at a share of it (0.7 by default). Below the knee the server keeps up, so every policy can be
judged on every request; near it work waits for batch places and KV slots, which is where a
policy has anything to choose (docs/compare.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from experiments.processes import locust, server

STEP_S, MAX_STEPS = 3, 20
STRESS = ["--mode", "stress", "--rate-start", "1", "--rate-mult", "1.4", "--step-s", str(STEP_S),
          "--max-steps", str(MAX_STEPS), "--warmup-s", "0", "-t", f"{STEP_S * MAX_STEPS + 10}s"]


class NoLoad(RuntimeError):
    """The stress found no rate the server holds."""


@dataclass(frozen=True)
class LoadChoice:
    rate: float
    knee: float
    share: float
    why: str


def choose(server_flags: list[str], workload: list[str], run_dir: Path,
           share: float) -> LoadChoice:
    """Stresses `python -m server server_flags` under the workload's flags (its requests and
    objectives) into run_dir, and returns the rate to compare at."""
    with server(server_flags, run_dir) as host:
        locust(host, run_dir, [*workload, *STRESS], limit_s=200)
    stress = json.loads((run_dir / "summary.json").read_text()).get("stress") or {}
    knee = stress.get("knee_rps")
    if not knee:
        raise NoLoad(f"the quick stress found no rate the server holds "
                     f"({stress.get('stopped_because')}; see {run_dir}): give the load (--rate) "
                     "yourself")
    rate = round(share * knee, 3)
    steps = stress.get("steps") or []
    at = next((s for s in steps if s["offered_rps"] >= rate), None)
    there = ("" if at is None else
             f"; the stress step at {at['offered_rps']:.3g}/s had TTFT p50 {at['ttft_p50_ms']:.3g} "
             f"ms, p99 {at['ttft_p99_ms']:.3g} ms")
    why = (f"{rate:g} requests/s: {share:g} x the knee {knee:.3g}/s of a quick stress of the "
           f"baseline ({len(steps)} steps of {STEP_S} s; {stress.get('stopped_because')}){there}")
    return LoadChoice(rate, knee, share, why)
