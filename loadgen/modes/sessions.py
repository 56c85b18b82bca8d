"""--mode sessions (docs/workloads.md): each arrival starts a multi-turn session
(loadgen/traffic/sessions.py), whose turns follow one another, each due its think time after
the previous reply's end and timed from then, until a turn does not end ok or the run stops."""

from __future__ import annotations

import logging
import time

import gevent
from gevent.pool import Group

from loadgen.modes.base import RunMode, RunView, registered
from loadgen.targets.client import CUT_OFF
from loadgen.traffic.sessions import History, Part, SessionPlanner
from records.load_settings import LoadSettings
from records.load_settings.choices import Mode
from records.requests import CLIENT_CANCELLED
from records.summary import SessionEnd

log = logging.getLogger("loadgen")
# how a session ends at a turn that did not end ok (other statuses: failed)
ENDS = {CLIENT_CANCELLED: SessionEnd.CANCELLED, CUT_OFF: SessionEnd.STOPPED}


@registered(Mode.SESSIONS)
class Sessions(RunMode):
    def __init__(self, settings: LoadSettings, workers: int = 1, index: int = 0):
        super().__init__(settings, workers, index)
        self.planner: SessionPlanner | None = None
        self.group = Group()  # the sessions' greenlets (their requests are the run's)

    def begin(self, run: RunView) -> None:
        self.planner = SessionPlanner(self.settings, run.workload)

    def build(self, run: RunView, index: int) -> object:
        return index

    def send(self, run: RunView, conn, built: object, due_ns: int) -> None:
        self.group.spawn(self.session, run, conn, built, due_ns)

    def drained(self) -> None:
        self.group.kill(block=True, timeout=5)  # what still runs ends stopped

    def session(self, run: RunView, conn, index: int, due_ns: int) -> None:
        """One session, its turns one after another. A drain that ends it mid-turn leaves it
        stopped."""
        plan = self.planner.plan(index)
        history = History(plan, run.workload, run.count.tokenizer)
        first_ns, last_ns, ok, outcome = due_ns, due_ns, 0, SessionEnd.STOPPED
        try:
            for turn in range(1, len(plan.messages) + 1):
                if turn > 1:
                    due_ns = last_ns + int(plan.think_s[turn - 2] * 1e9)
                    gevent.sleep(max(0.0, (due_ns - time.monotonic_ns()) / 1e9))
                    if run.stopping:
                        run.recorder.not_sent += due_ns <= run.stop_ns
                        break
                try:
                    spec = history.ask(turn)
                except ValueError as exc:  # a reply without text where the history is text
                    log.error("session %s ends at turn %d: %s", plan.session_id, turn, exc)
                    outcome = SessionEnd.FAILED
                    break
                greenlet, result = run.send_request(conn, spec, due_ns)
                greenlet.join()
                if not result.ok:
                    outcome = ENDS.get(result.status, SessionEnd.FAILED)
                    break
                ok, last_ns = ok + 1, result.recv_ns[-1]
                texts = "".join(result.reply_texts)
                history.answered(spec, Part(tuple(result.reply_ids) or None,
                                            texts if texts or not result.reply_ids else None))
            else:
                outcome = SessionEnd.COMPLETED
        finally:
            run.recorder.end_session(outcome, len(plan.messages), ok,
                                     (last_ns - first_ns) // 1000
                                     if outcome is SessionEnd.COMPLETED else None)

    @classmethod
    def shape(cls, settings: LoadSettings) -> str:
        t = settings.traffic
        return (f"{t.session_turns} turns, {t.think_time_s} s think time, "
                f"{super().shape(settings)} a turn")
