"""Rule-based bottleneck diagnosis of one run: each rule says whether it fired and
the numbers, with their times, that made it fire, did not, or could not be judged. The rules
live in analysis/rules/, one concept a module; this command applies them all.

Throughput: the wait queue grows while the device is under-utilised (the scheduler, policy or
KV pool holds requests back), or the requests in the server grow while it is busy
(compute-saturated, the knee; in a stress run, the step it stopped on saturation; both in
saturation.py); one layer's expert load is far above its mean, or copying expert weights in
takes a large share of step time (experts.py); the GPU waits for the host most of a step
(host_bound.py); the exchanges between expert-parallel ranks wait
long or fill the link (expert_parallel.py). Latency: windows whose TTFT or TPOT p99 jumps, lined
up with a hot expert, a cache-miss burst, queue growth or the load generator's own lateness
(spikes.py); and the generator's lateness, or its closed loop, over the whole run, and the
server's own write delay (delivery.py). From any server's own /metrics: saturation,
KV-cache pressure, prefix-cache misses, expert imbalance and a slow front door (scraped.py).
Failures: which codes, when, and when the server could not be reached (failures.py); faults
the server injected on purpose, and when (faults.py).
Reads only run-directory files.
"""

from __future__ import annotations

import argparse

from analysis.readers.files import RunDirError
from analysis.readers.rundir import Run, load_run
from analysis.rules.delivery import generator_limited, server_write_delay
from analysis.rules.expert_parallel import communication
from analysis.rules.experts import data_movement, expert_imbalance
from analysis.rules.failures import failures
from analysis.rules.faults import faults
from analysis.rules.finding import Finding
from analysis.rules.host_bound import host_bound
from analysis.rules.saturation import queue_rules
from analysis.rules.scraped import scraped_rules
from analysis.rules.spikes import Signals, latency_spikes, signals_of
from records.jsonform import dumps

DIAGNOSIS_MD = "diagnosis.md"


def diagnose(run: Run) -> list[Finding]:
    return rules(signals_of(run))


def rules(signals: Signals) -> list[Finding]:
    """Every rule on a run's signals (analysis/rules/spikes.py signals_of)."""
    return [failures(signals.run), faults(signals.run), *queue_rules(signals),
            expert_imbalance(signals), data_movement(signals), host_bound(signals),
            communication(signals.run.summary.server), latency_spikes(signals),
            generator_limited(signals), server_write_delay(signals), *scraped_rules(signals)]


def render_text(findings: list[Finding]) -> str:
    fired = [f for f in findings if f.fired]
    lines = [f"diagnosis: {len(fired)} of {len(findings)} rules fired"]
    for f in fired:
        lines += [f"FIRED {f.title}: {f.verdict}"] + [f"  - {e}" for e in f.evidence]
    lines += [f"not fired  {f.title}: {f.verdict}" for f in findings if f.judged and not f.fired]
    lines += [f"not judged {f.title}: {f.verdict}" for f in findings if not f.judged]
    return "\n".join(lines)


def render_markdown(findings: list[Finding]) -> str:
    fired = [f for f in findings if f.fired]
    parts = ["## Diagnosis",
             f"{len(fired)} of {len(findings)} rules fired (thresholds in "
             "`analysis/diagnosis.py` and `analysis/rules/`)."]
    for f in fired:
        parts += [f"### {f.title}", f.verdict, "\n".join(f"- {e}" for e in f.evidence)]
    if quiet := [f for f in findings if f.judged and not f.fired]:
        parts += ["### Did not fire", "\n".join(f"- **{f.title}**: {f.verdict}" for f in quiet)]
    if unjudged := [f for f in findings if not f.judged]:
        parts += ["### Could not be judged",
                  "\n".join(f"- **{f.title}**: {f.verdict}" for f in unjudged)]
    return "\n\n".join(parts) + "\n"


def add_command(commands) -> None:
    parser = commands.add_parser(
        "diagnose", help="bottleneck rules with their evidence: diagnosis.md")
    parser.add_argument("run_dir", help="directory holding summary.json, histograms.json and the "
                        "interval files")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> None:
    run = load_run(args.run_dir)
    findings = diagnose(run)
    print(render_text(findings))
    try:
        (run.path / DIAGNOSIS_MD).write_text(render_markdown(findings))
    except OSError as e:  # the message names the file
        raise RunDirError(f"cannot write the diagnosis: {e}") from None
    print(f"\ndiagnosis: {run.path / DIAGNOSIS_MD}")
    print(dumps({"fired": [f.rule for f in findings if f.fired],
                      "not_fired": [f.rule for f in findings if f.judged and not f.fired],
                      "not_judged": [f.rule for f in findings if not f.judged]}))
