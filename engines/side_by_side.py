"""Our load generator and vLLM's own `vllm bench serve` against the same vLLM server, the same
load, in alternating rounds, so the machine's drift falls on both alike; their TTFT and TPOT
percentiles side by side, and the replies each saw arrive all at once.

    python -m engines.side_by_side [--rate 4] [--duration-s 20] [--rounds 2] [--out DIR]

starts the tiny Qwen3-MoE (engines/tiny_model.py) on a real `vllm serve` (the engine tier's
environment, `make vllm-env`), prints the table and a last line of JSON. tests/engines runs the
same comparison.

TTFT here is each tool's own: ours from the scheduled send (docs/metrics.md), vLLM's bench from
its actual send; at this rate the two differ by the send lag, which our run reports (p99 about a
millisecond). Ours does not scrape the server's /metrics here, as vLLM's bench does not: each
scrape holds vLLM's API server for about 7 ms (55 KB of exposition on its event loop), which
lands on the TTFT of a request arriving meanwhile (docs/targets.md).

A reply "all at once" streamed at least two tokens and its last came within ONCE_MS of its
first: a client that stalled while the server streamed reads the whole reply in one go, so its
TTFT is its E2E. One that one client sees and the other does not is that client's stall.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engines.tiny_model import write_model
from engines.vllm_server import REPO, Bench, VllmServer

ONCE_MS = 1.0
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class PoissonLoad:
    rate: float = 4.0  # requests/s, Poisson
    duration_s: float = 20.0  # of each round
    prompt_tokens: int = 64
    output_tokens: int = 32

    @property
    def requests(self) -> int:
        return round(self.rate * self.duration_s)


@dataclass
class ToolFigures:
    """One tool's requests over its rounds: the latencies of each (ms)."""

    tool: str
    ttft_ms: list[float]
    tpot_ms: list[float]
    at_once: int = 0  # replies of two or more tokens whose tokens all came within ONCE_MS
    failed: int = 0

    def percentiles(self, metric: str) -> dict[int, float]:
        values = getattr(self, f"{metric}_ms")
        return {p: float(np.percentile(values, p)) for p in PERCENTILES} if values else {}

    def add(self, other: ToolFigures) -> None:
        self.ttft_ms += other.ttft_ms
        self.tpot_ms += other.tpot_ms
        self.at_once += other.at_once
        self.failed += other.failed


def locust(url: str, run_dir: Path, *flags: str, timeout_s: float) -> dict:
    """A headless run of our load generator (openai target, token ids) into run_dir; its
    summary.json."""
    command = [str(REPO / ".venv" / "bin" / "locust"), "-f", "loadgen/moe.py", "--host", url,
               "--target", "openai", "--token-ids", "--headless", "--only-summary",
               "--run-dir", str(run_dir), *flags]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode:
        raise RuntimeError(f"our run exited with code {done.returncode}:\n{done.stdout[-3000:]}"
                           f"{done.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def ours(url: str, load: PoissonLoad, run_dir: Path, seed: int) -> ToolFigures:
    """A headless run of our load generator (the default client) at the load."""
    locust(url, run_dir, "-t", f"{load.duration_s:g}s", "--rate", str(load.rate),
           "--prompt-tokens", str(load.prompt_tokens), "--max-tokens", str(load.output_tokens),
           "--seed", str(seed), "--server-metrics", "off", timeout_s=load.duration_s + 120)
    rows = [json.loads(line) for line in open(run_dir / "requests.jsonl")]
    ok = [r for r in rows if r["status"] == "OK"]
    return ToolFigures("ours", [r["ttft_ms"] for r in ok],
                       [r["tpot_ms"] for r in ok if r["tpot_ms"] is not None],
                       sum(r["messages"] >= 2 and r["e2e_ms"] - r["ttft_ms"] < ONCE_MS for r in ok),
                       len(rows) - len(ok))


def theirs(vllm: VllmServer, load: PoissonLoad, seed: int) -> ToolFigures:
    """vLLM's own bench at the load (its --save-detailed per-request figures)."""
    result = vllm.bench(Bench(load.rate, load.requests, load.prompt_tokens, load.output_tokens,
                              seed))
    ok = [i for i, error in enumerate(result["errors"]) if not error]
    ttft = [result["ttfts"][i] * 1e3 for i in ok]
    itls = [result["itls"][i] for i in ok]
    return ToolFigures("vllm bench", ttft,
                       [sum(gaps) * 1e3 / len(gaps) for gaps in itls if gaps],
                       sum(len(gaps) >= 1 and sum(gaps) * 1e3 < ONCE_MS for gaps in itls),
                       len(result["errors"]) - len(ok))


def alternate(vllm: VllmServer, load: PoissonLoad, rounds: int,
              out: Path) -> tuple[ToolFigures, ToolFigures]:
    """Ours, then theirs, `rounds` times; each tool's figures over its rounds."""
    mine, bench = ToolFigures("ours", [], []), ToolFigures("vllm bench", [], [])
    for i in range(rounds):
        mine.add(ours(vllm.url, load, out / f"ours-{i}", seed=i))
        bench.add(theirs(vllm, load, seed=i))
    return mine, bench


def ratio_interval(mine: ToolFigures, bench: ToolFigures, metric: str, q: float,
                   draws: int = 2000) -> tuple[float, float, float]:
    """Ours over vLLM's bench at percentile q of the metric: the ratio and its 95% bootstrap
    interval (each tool's requests resampled apart; seeded, so a run repeats)."""
    rng = np.random.default_rng(0)
    a, b = (np.asarray(getattr(f, f"{metric}_ms")) for f in (mine, bench))
    ratios = (np.percentile(rng.choice(a, (draws, len(a))), q, axis=1)
              / np.percentile(rng.choice(b, (draws, len(b))), q, axis=1))
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(np.percentile(a, q) / np.percentile(b, q)), float(low), float(high)


def table(mine: ToolFigures, bench: ToolFigures) -> str:
    lines = ["ms            " + "".join(f"{f'p{p}':>9}" for p in PERCENTILES)
             + "  requests  all at once  failed"]
    for metric in ("ttft", "tpot"):
        for figures in (mine, bench):
            row = figures.percentiles(metric)
            lines.append(f"{metric} {figures.tool:<10}"
                         + "".join(f"{row.get(p, float('nan')):9.1f}" for p in PERCENTILES)
                         + f"  {len(getattr(figures, f'{metric}_ms')):8d}  {figures.at_once:11d}"
                         f"  {figures.failed:6d}")
    for metric in ("ttft", "tpot"):
        point, low, high = ratio_interval(mine, bench, metric, 99)
        lines.append(f"{metric.upper()} p99, ours / vllm bench: x{point:.2f} (95% interval "
                     f"{low:.2f}-{high:.2f})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m engines.side_by_side", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=4.0)
    parser.add_argument("--duration-s", type=float, default=20.0, help="of each round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "side-by-side")
    args = parser.parse_args()
    load = PoissonLoad(args.rate, args.duration_s)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as model, \
            VllmServer(write_model(Path(model) / "tiny-qwen3-moe"), args.out / "vllm.log") as vllm:
        mine, bench = alternate(vllm, load, args.rounds, args.out)
    print(table(mine, bench))
    print(json.dumps({"load": asdict(load), "rounds": args.rounds,
                      **{f.tool: {m: f.percentiles(m) for m in ("ttft", "tpot")}
                         | {"at_once": f.at_once, "failed": f.failed} for f in (mine, bench)}}))


if __name__ == "__main__":
    main()
