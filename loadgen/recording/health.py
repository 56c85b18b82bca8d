"""The load generator's health over a run: the warnings that say its own lateness, load or
the server's answers make some figures suspect (summary.json's `generator`)."""

from __future__ import annotations

from loadgen.recording.cpu import GeneratorCpu
from loadgen.recording.recorder import LATE_SEND_MS, Recorder
from records.summary import CPU_WAIT_PERCENT, Generator

LATE_LOOP_MS = 5.0  # the generator's loop lag p99 above this: its timestamps are that late
# ... unless this share of the streams (or more) was timed by the kernel's receipt
KERNEL_TIMED_SHARE = 0.99
# a core's share past which a client's timing suffers (docs/measured.md), and how: gevent's
# delivery lag grows past half a core; the aio sender's messages are timed by the kernel's
# receipt, and its sends fall behind as it nears a whole core (80%: none limited at 55-61% of
# a core, TTFT and ITL at 87%, in make bench-loadgen's sweep)
BUSY_CPU = {"aio": (80.0, "its sends fall behind their schedule"),
            "gevent": (50.0, "its receive timestamps lag (tens of ms at p99)")}


def generator_health(rec: Recorder, cpu: GeneratorCpu, closed_loop: bool = False,
                     client: str = "") -> Generator:
    """Whether the load generator kept its schedule and timed the streams truly, from what rec
    recorded: its warnings, each saying what to change. client: who sent and timed the streams
    (aio or gevent)."""
    lag = rec.client["send_lag"].stats()
    warnings = []
    if closed_loop:
        warnings.append("closed loop: each user waited for its previous response before "
                        "sending, so a slow or stalled server received fewer requests and "
                        "its queueing is under-stated (coordinated omission); use --mode "
                        "fixed to measure latency under a given load")
    warnings += cpu_warnings(cpu, client)
    # kept waiting by other processes, more of its own would wait too
    more = ("see its wait for a core above" if (cpu.waited_percent or 0) > CPU_WAIT_PERCENT else
            "add Locust worker processes (--processes N, with -u N) or lower the rate")
    loop = rec.client["loop_lag"].stats()
    kernel_timed = rec.kernel_timed_share >= KERNEL_TIMED_SHARE
    if (loop.p99 or 0) > LATE_LOOP_MS:
        warnings.append(
            f"the generator's event loop woke up to {loop.p99:.1f} ms late (loop lag p99, "
            f"above {LATE_LOOP_MS:g} ms): "
            + ("its sends could be that late (its messages were timed by the kernel's "
               "receipt); " if kernel_timed else "its message timestamps are that late; ")
            + ("use --client aio (fixed, mixed and sla modes), " if client == "gevent" else "")
            + more)
    if rec.late_sends:
        warnings.append(
            f"{rec.late_sends} of {sum(rec.statuses.values())} requests were sent more than "
            f"{LATE_SEND_MS:g} ms after their scheduled time "
            f"(send lag p99 {lag.p99 or 0:.1f} ms, "
            f"max {lag.max or 0:.1f} ms): "
            "the load generator could not keep up; latencies still count from the schedule, "
            f"but to measure the server alone {more}")
    if rec.not_sent:
        warnings.append(f"{rec.not_sent} scheduled requests were not sent: over "
                        "--max-in-flight (the server is not keeping up with the offered "
                        "rate), or due before the run stopped and not reached by then (the "
                        "load generator behind its schedule)")
    warnings += count_warnings(rec)
    limited = rec.limits.limited(kernel_timed)
    return Generator(late_sends=rec.late_sends, late_threshold_ms=LATE_SEND_MS,
                     cpu_percent=cpu.used_percent, client=client, limited=limited,
                     warnings=warnings + limited_warnings(limited, more),
                     cpu_wait_percent=cpu.waited_percent)


def count_warnings(rec: Recorder) -> list[str]:
    """What the recorder counted that makes the figures suspect: lengths other than asked,
    values clamped."""
    warnings = []
    if rec.off_length:
        warnings.append(f"{rec.off_length} of {rec.statuses['OK']} ok requests got another "
                        "output length than --max-tokens asked (the server's usage says so): "
                        "it ended them at end-of-sequence, so the workload is not the one "
                        "asked for (TPOT still holds); use a server that takes ignore_eos "
                        "or min_tokens (--exact-length)")
    if rec.after_stop:
        warnings.append(f"{rec.after_stop} requests due after the run's stop were sent before "
                        "the sender heard of it (a distributed worker, a stop from the web UI): "
                        "outside the run, not counted in it")
    clamped = sum(h.clamped for h in rec.client.values())
    if clamped:
        warnings.append(f"{clamped} latency values fell outside the histogram range "
                        "and were clamped")
    return warnings


def limited_warnings(limited: dict[str, str], more: str) -> list[str]:
    """A warning for each figure the generator limited (loadgen/recording/limits.py)."""
    return [f"{figure.upper()} is generator-limited {why}: it measures the load generator, not "
            f"the server; {more}" for figure, why in limited.items()]


def cpu_warnings(cpu: GeneratorCpu, client: str = "") -> list[str]:
    """The generator short of CPU: busy itself, or kept waiting for a core by others. client:
    the one that timed the streams (aio or gevent; gevent's bound where unknown)."""
    warnings = []
    busy, suffers = BUSY_CPU.get(client, BUSY_CPU["gevent"])
    if cpu.used_percent > busy:
        warnings.append(f"the load generator used {cpu.used_percent:.0f}% of a core; above "
                        f"{busy:g}% {suffers}: add Locust worker processes (--processes N, "
                        "with -u N) or lower the rate")
    if (cpu.waited_percent or 0) > CPU_WAIT_PERCENT:
        warnings.append(f"the process that timed the streams waited for a core "
                        f"{cpu.waited_percent:.0f}% of the run while it had work, using "
                        f"{cpu.used_percent:.0f}% of one: other processes held the cores (a "
                        "server on this machine, such as vLLM's CPU worker, which spins), so "
                        "its sends and timestamps were late by as much; give it cores of its "
                        "own, or start it from the same login session as the server, which "
                        "Linux schedules as one group with it (docs/measured.md)")
    return warnings
