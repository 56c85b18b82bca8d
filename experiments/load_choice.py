"""The load a comparison runs at, where none is given: a quick stress of the baseline policy's
server (the offered rate x1.4 every 3 s from 1 request/s until a step saturates, judged at the
comparison's objectives) finds what it can carry: what it completed a second in the step that
overloaded it, or the knee (the highest step that held) where that is lower. A 3 s step near
the limit can hold by luck before its queue shows (measured here: the knee read 40.5 and 56.7
requests/s in two stresses of one server, which completed 40.3 and 42.7 a second when
overloaded), so the completions are the steadier figure. The comparison runs at a share of it
(0.7 by default): below the limit the server keeps up, so every policy can be judged on every
request; near it work waits for batch places and KV slots, which is where a policy has anything
to choose (docs/compare.md)."""

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
    carried: float  # what the server carried: the figure the rate is a share of
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
    steps = stress.get("steps") or []
    over = steps[-1] if steps and steps[-1].get("saturated") else None
    carried = knee if over is None else min(knee, over["achieved_rps"])
    rate = round(share * carried, 3)
    source = (f"the knee {knee:.3g}/s" if over is None or carried == knee else
              f"the {carried:.3g}/s it completed when overloaded (at {over['offered_rps']:.3g}/s"
              f" offered; the knee read {knee:.3g}/s)")
    why = (f"{rate:g} requests/s: {share:g} x {source}, from a quick stress of the baseline "
           f"({len(steps)} steps of {STEP_S} s; {stress.get('stopped_because')})")
    return LoadChoice(rate, carried, share, why)
