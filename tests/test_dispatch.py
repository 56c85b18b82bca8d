"""The send loop's rule (loadgen/traffic/dispatch.py): every arrival due before the stop is sent
or counted as not sent, exactly once. On the loop itself against a clock it is told (a sender
that falls behind, a cap reached, callers sharing a schedule, a caller ended as it waits), and
through both senders, end to end, against the schedule they were given."""

from __future__ import annotations

import json

import gevent
import pytest

from loadgen.run import SharedSchedule
from loadgen.traffic.dispatch import SendCounts, dispatch, due_before
from loadgen.traffic.profiles import schedule_of
from records.load_settings import TrafficSettings
from tests.conftest import delay_server_process
from tests.test_end_to_end import locust

S = 1_000_000_000  # ns


class HandClock:
    """Sends: a clock moved by hand, the requests in flight closed by hand, a stop."""

    def __init__(self):
        self.now_ns = 0
        self.sent: list[int] = []
        self.open = 0
        self.stopped: int | None = None

    def build(self, index: int, due_ns: int) -> object:
        return index

    def send(self, built: object, due_ns: int) -> None:
        self.sent.append(built)
        self.open += 1

    def in_flight(self) -> int:
        return self.open

    def stop_ns(self) -> int | None:
        return self.stopped


def every_second(n: int):
    return iter([(i, float(i)) for i in range(n)])


def drive(loop, sender: HandClock, late_ns: int = 0, stop_at_ns: int | None = None) -> None:
    """Waits as a sender does: to each due time plus late_ns; the run stops at stop_at_ns."""
    for due_ns in loop:
        if due_ns is not None:
            sender.now_ns = max(sender.now_ns, due_ns + late_ns)
        if stop_at_ns is not None and sender.now_ns >= stop_at_ns:
            sender.stopped = stop_at_ns


def test_on_time_every_arrival_before_the_stop_is_sent():
    sender, tally = HandClock(), SendCounts()
    drive(dispatch(every_second(10), 0, 100, sender, tally), sender, stop_at_ns=int(4.5 * S))
    assert sender.sent == [0, 1, 2, 3, 4] and tally == SendCounts(sent=5)


def test_a_sender_behind_at_the_stop_counts_what_it_did_not_reach():
    # each wait ends 2.5 s late: arrival 2 (due 2 s) is sent at 4.5 s, the stop at 5 s; due by
    # then and not reached: 3, 4, 5
    sender, tally = HandClock(), SendCounts()
    drive(dispatch(every_second(10), 0, 100, sender, tally), sender, late_ns=int(2.5 * S),
          stop_at_ns=5 * S)
    assert sender.sent == [0, 1, 2]
    assert (tally.sent, tally.overtaken, tally.full) == (3, 3, 0)


def test_a_sender_past_the_schedules_end_before_it_heard_of_an_earlier_stop_counts_to_it():
    # a distributed worker's sender, 2.5 s behind: its schedule's end (-t from its own start,
    # 6 s) passes before it hears of the run's stop (the master's, at 4.5 s); it counted what
    # it did not reach up to 6 s, and the stop, once heard, leaves what fell due after it out
    sender, tally = HandClock(), SendCounts()
    drive(dispatch(every_second(10), 0, 100, sender, tally), sender, late_ns=int(2.5 * S),
          stop_at_ns=6 * S)
    assert sender.sent == [0, 1, 2, 3] and tally.overtaken_ns == [4 * S, 5 * S, 6 * S]
    tally.stopped_at(int(4.5 * S))
    assert tally.sent + tally.not_sent == 5  # 0..4, every arrival due by the stop, once


def test_an_idle_schedule_is_waited_for_and_neither_sent_nor_counted():
    # the SLA search's schedule between probes: (None, when to look again) twice, then arrivals
    schedule = iter([(None, 0.5), (None, 1.0), (0, 1.5), (None, 2.0), (1, 2.5), (2, 3.5)])
    sender, tally = HandClock(), SendCounts()
    waits = []
    loop = dispatch(schedule, 0, 100, sender, tally)
    for due_ns in loop:
        waits.append(due_ns)
        if due_ns is not None:
            sender.now_ns = due_ns
        if sender.now_ns >= 3 * S:
            sender.stopped = 3 * S
    assert waits[:3] == [S // 2, S, int(1.5 * S)] and sender.sent == [0, 1]
    assert (tally.sent, tally.overtaken) == (2, 0)  # 2 is due after the stop: never due
    rest = iter([(None, 2.0), (3, 2.9), (None, 3.0), (4, 3.1)])
    assert due_before(rest, 0, 3 * S) == 1  # idle entries are no arrivals


def test_arrivals_past_the_cap_are_counted_not_sent():
    sender, tally = HandClock(), SendCounts()
    drive(dispatch(every_second(10), 0, 3, sender, tally), sender, stop_at_ns=int(7.5 * S))
    assert sender.sent == [0, 1, 2] and (tally.full, tally.overtaken) == (5, 0)
    assert tally.sent + tally.not_sent == 8


def test_callers_sharing_a_schedule_count_each_arrival_once():
    arrivals, sender = every_second(20), HandClock()
    tallies = [SendCounts(), SendCounts()]
    loops = [dispatch(arrivals, 0, 100, sender, t) for t in tallies]
    waiting = [next(loop) for loop in loops]  # each holds an arrival: 0 and 1
    sender.now_ns = 12 * S
    sender.stopped = 10 * S  # both resume after the stop: the first counts the rest due
    for loop in loops:
        for _ in loop:
            pass
    assert waiting == [0, S] and sender.sent == []
    assert sum(t.overtaken for t in tallies) == 11  # 0 .. 10 s
    assert due_before(arrivals, 0, 10 * S) == 0  # none left uncounted


def test_a_caller_ended_as_it_waits_counts_the_arrival_it_held_if_it_was_due():
    for stop_s, counted in ((3, 1), (1, 0)):
        sender, tally = HandClock(), SendCounts()
        loop = dispatch(iter([(0, 2.0)]), 0, 100, sender, tally)
        next(loop)
        sender.stopped = stop_s * S
        loop.close()  # as a greenlet killed in its sleep closes it
        assert tally.overtaken == counted


def due_count(traffic: TrafficSettings, duration_s: float) -> int:
    return due_before(schedule_of(traffic, 1, 0), 0, int(duration_s * S))


@pytest.mark.slow
@pytest.mark.parametrize(("client", "users"), [("gevent", 1), ("gevent", 2), ("aio", 1)])
def test_both_senders_account_for_every_arrival_due(tmp_path, client, users):
    # 40 requests/s of 250 ms each against a cap of 4 in flight: most are not sent
    run_dir = tmp_path / "run"
    with delay_server_process(tmp_path, "--ttft-ms", "100", "--itl-ms", "50") as (_, port):
        done = locust(port, run_dir, "--client", client, "-u", str(users), "-r", str(users),
                      "-t", "3s", "--rate", "40", "--seed", "3", "--max-in-flight", "4",
                      "--prompt-tokens", "4", "--max-tokens", "4")
    assert done.returncode == 0, done.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    req = summary["requests"]
    due = due_count(TrafficSettings(rate=40, seed=3), summary["duration_s"])
    assert req["not_sent"] > 0 and req["sent"] > 0, req
    assert req["sent"] + req["not_sent"] == due, (req, due)


def test_users_sharing_a_schedule_that_waits_inside_take_turns():
    # the SLA probes' schedule waits inside for its next probe: a second user must wait for the
    # first, not resume the generator under it ("generator already executing")
    def waits_inside():
        for i in range(6):
            gevent.sleep(0.01)
            yield i, 0.0

    shared = SharedSchedule(waits_inside())
    taken: list[int] = []
    users = [gevent.spawn(lambda: taken.extend(i for i, _ in shared)) for _ in range(3)]
    gevent.joinall(users, raise_error=True)
    assert sorted(taken) == list(range(6))
    held = SharedSchedule(waits_inside())
    user = gevent.spawn(next, held)
    gevent.sleep(0.001)  # the user waits inside: nothing in it is due
    assert held.dues_by(0, 10 * S) == []
    user.join()
    assert held.dues_by(0, 10 * S) == [0] * 5


def test_a_request_due_after_the_stop_is_counted_apart_and_nowhere_else():
    """A sender that heard of the stop late (a distributed worker's) sent one due after it: it
    is outside the run, so scheduled = sent + not sent still holds, and the run says so."""
    from loadgen.recording.cpu import GeneratorCpu
    from loadgen.recording.health import generator_health
    from loadgen.recording.recorder import Recorder
    from loadgen.targets.client import StreamResult

    rec = Recorder(0, 0.0)
    rec.stop_ns = 3 * S
    for due_ns in (2 * S, 3 * S + 1):
        rec.add(StreamResult(f"r{due_ns}", due_ns, sent_ns=due_ns, recv_ns=[due_ns + S],
                             tokens=[1], server_elapsed_us=[0], finish_reason="length"))
    assert (rec.accounting().sent, rec.after_stop, len(rec.rows)) == (1, 1, 1)
    warnings = generator_health(rec, GeneratorCpu(5.0)).warnings
    assert any("1 requests due after the run's stop" in w for w in warnings), warnings
