"""The open-loop sender on plain asyncio (the target's async client: grpc.aio, or for HTTP
loadgen/targets/http1.py), in a process of its own (--client aio).

Locust's process runs its clients through gevent, whose integration costs timing accuracy at
high message rates (docs/measured.md, `make bench-loadgen`). This process has no gevent: it
sends the schedule and timestamps every message itself. Its parent (loadgen/aio_client.py)
writes one JSON job line to its stdin ({"config": the settings, flat, "workers", "index"}) as
the run is set up; once the target's client is imported and connected the sender answers
{"ready": true}, and the parent starts the schedule with a line of its time zero ({"start_ns"},
with "end_ns" where -t set the schedule's end: nothing due after it is sent, however late the
stop's line comes); at the end of a finite schedule (a trace) it writes {"schedule_over": true}.
It reads one JSON line per finished request from its stdout (written in batches EMIT_S apart),
and writes {"stop_ns"} to end the schedule at that time (arrivals due by then that were not sent
are counted: loadgen/traffic/dispatch.py); the sender then drains for drain_s, cuts off what is
left, reports it, writes {"end": true, "not_sent": n, "offered": what its requests asked for
(loadgen/traffic/offered.py), "cpu_s": its CPU seconds since time zero, "cpu_wait_s": the
seconds it waited for a core meanwhile (null: unknown; loadgen/recording/cpu.py)} and exits.
Every second it also writes {"loop_lag": [[t_ns, late_us], ...]}, its event loop's own lateness
(loadgen/recording/loop_lag.py). It builds the same schedule and requests as the gevent path
(loadgen/traffic/). In an SLA search its schedule is its part of the probes
(loadgen/sla/part.py): the parent passes on each probe's start and cut ({"sla": START or CUT,
...}), and it writes its part of the current probe every quarter second ({SAMPLE: ...}). Times
are CLOCK_MONOTONIC nanoseconds, one clock for both processes. Output goes through a
non-blocking pipe writer, so a slow reader never stalls the sends.
"""

from __future__ import annotations

import asyncio
import gc
import json
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvloop

from loadgen.recording.cpu import CpuClock
from loadgen.recording.loop_lag import asyncio_probe
from loadgen.sla.part import CUT, JUDGE_S, SAMPLE, START, ProbePart
from loadgen.targets.client import StreamResult, astream_request, cut_off
from loadgen.targets.target import RequestSpec, Target, target_of
from loadgen.targets.text_tokens import TextCounter
from loadgen.traffic.dispatch import SendCounts, dispatch, stop_or_end
from loadgen.traffic.offered import Offered
from loadgen.traffic.profiles import schedule_of
from loadgen.traffic.workload import Workload
from records.declare import build
from records.load_settings import LoadSettings
from records.load_settings.choices import Mode

SPIN_S = 0.0015
SPIN_RATE = 50.0  # requests/s a sender, at most, where its sends are spun into: 7.5% of a core
# result lines go to the parent in batches this far apart: a wake of Locust's process a batch,
# not a request (each wake took a core from the streams' timing when they shared two)
EMIT_S = 0.02
# a send this late says the sender is behind: the next goes out without a turn of the loop
# between them (a turn reads every stream that has data: at 50k events/s, milliseconds)
BEHIND_NS = 1_000_000


async def main(job: dict) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    transport, _ = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout)
    settings = build(LoadSettings, job["config"])
    sender = settings.sender
    workload = Workload(settings)
    target = target_of(settings.target)
    count = TextCounter(settings.target.tokenizer)
    traffic = settings.traffic
    part = (ProbePart(traffic, job["workers"], job["index"]) if traffic.mode == Mode.SLA
            else None)
    schedule = (part.arrivals() if part is not None else
                schedule_of(traffic, job["workers"], job["index"]))
    # epoll waits whole milliseconds, rounded up: at a low rate the last stretch before a send
    # is yielded through instead, which costs a core SPIN_S x the rate at most (not between
    # an SLA search's probes: its schedule looks for the next one every few milliseconds)
    spin_s = (SPIN_S if not traffic.trace and part is None
              and traffic.rate / job["workers"] <= SPIN_RATE else 0.0)
    conn = await target.aconnect(sender.host)
    # what set-up made is never collected again: a full collection then walks only what the
    # run makes (a saturated process was seen to pause 56 ms in one: docs/measured.md)
    gc.freeze()
    transport.write(b'{"ready": true}\n')
    try:
        line = await reader.readline()
        if line.strip():  # else the run ended before it began
            times = json.loads(line)
            sender = Sender(settings, workload, target, conn, count, transport, spin_s, part)
            sender.end_ns = times.get("end_ns")
            await sender.run(times["start_ns"], reader, schedule)
    finally:
        await target.aclose(conn)


@dataclass
class Sender:
    """What the sends go through, connected, and where their results are written."""

    settings: LoadSettings
    workload: Workload
    target: Target
    conn: Any  # the target's connection (Target.aconnect)
    count: TextCounter
    transport: asyncio.WriteTransport
    spin_s: float  # the last stretch before each send is spun, not slept
    part: ProbePart | None = None  # its part of an SLA search's probes
    tasks: dict[asyncio.Task, StreamResult] = field(default_factory=dict)  # in flight
    offered: Offered = field(default_factory=Offered)  # what the requests sent asked for
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    stopped_ns: int | None = None  # the run's stop, as the parent timed it
    behind: bool = False  # the last send was late by more than BEHIND_NS
    end_ns: int | None = None  # the schedule's end, where the parent knew it ahead (-t)
    lines: list[bytes] = field(default_factory=list)  # emitted, not yet written

    def emit(self, data: dict) -> None:
        """One JSON line to the parent, written with the others of the next EMIT_S (flush)."""
        self.lines.append(orjson.dumps(data))  # a fifth of json's time
        if len(self.lines) == 1:
            asyncio.get_running_loop().call_later(EMIT_S, self.flush)

    def flush(self) -> None:
        """The lines emitted so far, written: buffered by the loop, never blocks."""
        if self.lines:
            self.lines.append(b"")
            self.transport.write(b"\n".join(self.lines))
            self.lines.clear()

    def done(self, task: asyncio.Task) -> None:
        result = self.tasks.pop(task)
        if self.part is not None:
            self.part.observe(result)
        # plain fields only: vars is asdict's result, without its deep copy
        self.emit(vars(result))

    async def run(self, start_ns: int, reader: asyncio.StreamReader, schedule) -> None:
        """The schedule from start_ns until the stop (or its end), then the drain."""
        cpu = CpuClock()  # from time zero, not its imports

        async def watch_stdin():
            while True:  # the SLA search's probes, then the stop's time (EOF: the parent died)
                line = await reader.readline()
                data = json.loads(line) if line.strip() else {}
                if "sla" not in data:
                    break
                self.probe_told(data)
            self.stopped_ns = data["stop_ns"] if data else time.monotonic_ns()
            self.stopped.set()
            if self.part is not None:
                self.part.end()

        watcher = asyncio.create_task(watch_stdin())
        if self.part is not None:
            self.part.begin(start_ns)
            sampler = asyncio.create_task(self.send_samples())
        lags = LagLines(self.emit)
        probe = asyncio.create_task(asyncio_probe(lags.add))
        tally = SendCounts()
        await Paced(dispatch(schedule, start_ns, self.settings.sender.max_in_flight, self,
                             tally), self).run()
        if not self.stopped.is_set():  # a finite schedule (a trace) is sent: the parent stops
            self.emit({"schedule_over": True})
            self.flush()
        await watcher
        tally.stopped_at(self.stopped_ns)
        if self.part is not None:
            sampler.cancel()
        await drain(self.tasks, self.done, self.settings.sender.drain_s, self.emit)
        probe.cancel()
        lags.flush()
        cpu_s, waited_s = cpu.spent()
        self.emit({"end": True, "not_sent": tally.not_sent, "offered": self.offered.state(),
                   "cpu_s": cpu_s, "cpu_wait_s": waited_s})
        self.flush()
        while self.transport.get_write_buffer_size():
            await asyncio.sleep(0.01)

    def probe_told(self, data: dict) -> None:
        """The SLA search's START or CUT of a probe."""
        if data["sla"] == START:
            self.part.start(data["probe"], data["rate"])
        elif data["sla"] == CUT and data["probe"] == self.part.probe:
            self.part.stop_arrivals()

    async def send_samples(self) -> None:
        """Its part of the current probe, every JUDGE_S, as a distributed run's worker's."""
        while True:
            sample = self.part.sample(self.tasks.values())
            self.emit({SAMPLE: {"worker": 0, **sample.to_message()}})
            await asyncio.sleep(JUDGE_S)

    # loadgen/traffic/dispatch.py's Sends

    def build(self, index: int, due_ns: int) -> tuple[RequestSpec, StreamResult]:
        # before its time, not after: a request's draws cost 0.1 ms, cold, at rest
        spec = self.workload.request(index)
        return spec, StreamResult.of(spec, due_ns)

    def send(self, built: tuple[RequestSpec, StreamResult], due_ns: int) -> None:
        spec, r = built
        self.behind = time.monotonic_ns() - due_ns > BEHIND_NS
        task = asyncio.create_task(astream_request(self.target, self.conn, spec, r,
                                                   self.settings.sender.request_timeout_s,
                                                   self.count))
        self.tasks[task] = r
        task.add_done_callback(self.done)
        self.offered.add(spec)

    def in_flight(self) -> int:
        return len(self.tasks)

    def stop_ns(self) -> int | None:
        return stop_or_end(self.stopped_ns, self.end_ns)


class Paced:
    """A dispatch (loadgen/traffic/dispatch.py) stepped from the loop's own callbacks: a timer
    that falls due sends in its own turn of the loop, where a task it woke would send a turn
    later, and each turn reads every stream that has data (at 25k events/s, milliseconds).
    The last SPIN_S before a send is spun (see main), and a send never goes before its time:
    uvloop's timers count whole milliseconds from the loop's time at its turn's start, so
    they can fire early. After a send the next step waits a turn, so the request goes out
    before the next is built, unless the sender is behind: its requests then go out together,
    in order, at the next turn."""

    def __init__(self, steps: Iterator[int | None], sender: Sender):
        self.steps, self.sender = steps, sender
        self.loop = asyncio.get_running_loop()
        self.over = self.loop.create_future()
        self.due_ns: int | None = None  # the time being waited for

    async def run(self) -> None:
        self.step()
        await self.over

    def step(self) -> None:
        try:
            if self.due_ns is not None and self.wait():
                return
            for due_ns in self.steps:
                if due_ns is None:
                    if not self.sender.behind:
                        self.loop.call_soon(self.step)
                        return
                elif self.wait(due_ns):
                    return
        except BaseException as exc:  # a bug: the run fails with it, not silently
            self.over.set_exception(exc)
            return
        self.over.set_result(None)

    def wait(self, due_ns: int | None = None) -> bool:
        """Whether there is still time to wait until due_ns (the last one when None): a
        timer, or the next turn where the time is spun."""
        due_ns = self.due_ns = due_ns or self.due_ns
        left_s = (due_ns - time.monotonic_ns()) / 1e9
        if left_s <= 0 or self.sender.stopped.is_set():
            self.due_ns = None
            return False
        if left_s > self.sender.spin_s:
            self.loop.call_later(left_s - self.sender.spin_s, self.step)
        else:
            self.loop.call_soon(self.step)
        return True


class LagLines:
    """The event loop's lateness, written a line a second ({"loop_lag": [[t_ns, late_us]]})."""

    def __init__(self, emit: Callable[[dict], None]):
        self.emit = emit
        self.lags: list[tuple[int, int]] = []

    def add(self, t_ns: int, late_us: int) -> None:
        self.lags.append((t_ns, late_us))
        if t_ns - self.lags[0][0] >= 1e9:
            self.flush()

    def flush(self) -> None:
        if self.lags:
            self.emit({"loop_lag": self.lags[:]})
            self.lags.clear()


async def drain(tasks: dict[asyncio.Task, StreamResult], done, drain_s: float, emit) -> None:
    """Waits up to drain_s for the requests in flight, then cuts off and reports the rest. One
    that ended as the wait did has its callback (done) queued: it reports itself, whole."""
    if tasks:
        await asyncio.wait(list(tasks), timeout=drain_s)
    for task in [t for t in tasks if not t.done()]:
        task.remove_done_callback(done)
        task.cancel()
        r = tasks.pop(task)
        cut_off(r, drain_s)
        emit(vars(r))
    await asyncio.sleep(0)  # the queued callbacks run


def fast(job: dict) -> bool:
    """Whether the sender runs on uvloop: past SPIN_RATE requests/s, where its CPU an event
    counts (14% less than asyncio's loop at 19k events/s); below it on asyncio's own, whose
    timers never fire early (docs/measured.md)."""
    return build(LoadSettings, job["config"]).traffic.rate / job["workers"] > SPIN_RATE


if __name__ == "__main__":
    # Ctrl-C reaches the terminal's whole process group: the parent ends the run, which stops
    # this process by its pipe, so what it holds is reported rather than lost
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the job, before any loop: the parent writes nothing more until the sender is ready
    line = sys.stdin.buffer.readline()
    if line:  # else the parent closed the pipe without a job
        job = json.loads(line)
        (uvloop.run if fast(job) else asyncio.run)(main(job))
