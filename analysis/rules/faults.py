"""The diagnosis rule for a fault rehearsal: when the server's --fault-* settings were on, what
they injected during the run and when the fault window was open, so failures and slow windows
are read as the rehearsal they are. Reads server_stats.jsonl (GetStats every --interval-s)."""

from __future__ import annotations

from analysis.readers.rundir import Run
from analysis.rules.failures import windows
from analysis.rules.finding import Finding
from records.server_stats import FaultCounts, ServerSample

KINDS = {"steps_failed": "engine steps failed", "streams_dropped": "streams dropped",
         "requests_slowed": "requests slowed", "stalls": "engine stalls"}


def fault_settings(samples: list[ServerSample]) -> dict[str, str]:
    """The server's --fault-* settings that are on, from its first answered sample."""
    first = next((s.stats for s in samples if s.stats.ok), None)
    if first is None:
        return {}
    return {name: value for name, value in first.settings.items()
            if name.startswith("fault_") and value not in ("", "0.0", "0")
            and name != "fault_slow_ms"}


def open_windows(samples: list[ServerSample]) -> list[tuple[float, float]]:
    """The run's seconds in which the fault window was open, from the samples that saw it."""
    active = [s.t_run_s for s in samples if s.stats.ok and s.stats.faults is not None
              and s.stats.faults.active]
    return [(first, last) for first, last, _ in windows(active)]


def injected(samples: list[ServerSample]) -> dict[str, float]:
    """Each kind of fault injected between the first and the last answered sample."""
    counted = [s.stats.faults or FaultCounts() for s in samples if s.stats.ok]
    if not counted:
        return {}
    return {kind: getattr(counted[-1], kind) - getattr(counted[0], kind)
            for kind in (*KINDS, "stall_s")}


def faults(run: Run) -> Finding:
    rule = ("faults", "Injected faults (rehearsal)")
    samples = run.samples
    on = fault_settings(samples)
    if not on:
        return Finding(*rule, False, "no fault was injected (the server's --fault-* settings "
                       "are off)" if samples else "server_stats.jsonl has no GetStats sample: "
                       "cannot tell whether faults were injected", [], judged=bool(samples))
    counts = injected(samples)
    spans = open_windows(samples)
    told = ", ".join(f"{counts[kind]:g} {label}" for kind, label in KINDS.items()
                     if counts.get(kind))
    when = ", ".join(f"{a:.1f}-{b:.1f} s" for a, b in spans) or "no sample saw it open"
    evidence = ["settings: " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in on.items()),
                f"fault window open at {when} of the run"]
    if counts.get("stall_s"):
        evidence.append(f"the engine stalled {counts['stall_s']:g} s in all")
    verdict = (f"the server injected faults on purpose: {told or 'none during the run'}; "
               "failures and slow windows there are the rehearsal's")
    return Finding(*rule, True, verdict, evidence)
