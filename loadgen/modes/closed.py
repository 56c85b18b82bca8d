"""--mode closed: Locust's own model. Each user sends its next request when the last one ends,
and latency counts from the actual send: a slow server slows the offered load, which hides
its queueing (the run says so)."""

from __future__ import annotations

import itertools
import time

from loadgen.modes.base import RunMode, RunView, registered
from records.load_settings import LoadSettings
from records.load_settings.choices import Mode


@registered(Mode.CLOSED)
class Closed(RunMode):
    def __init__(self, settings: LoadSettings, workers: int = 1, index: int = 0):
        super().__init__(settings, workers, index)
        # run-wide unique ids
        self._indexes = (k * workers + index for k in itertools.count())

    def arrivals(self):
        return iter(())

    def user(self, run: RunView, conn) -> None:
        """This user's requests one after another until the stop. Each runs in the run's
        group, so a user stopped mid-stream still leaves it to the drain and the count."""
        run.begin()
        while not run.stopping:
            spec = run.workload.request(next(self._indexes))
            run.send_request(conn, spec, time.monotonic_ns())[0].join()

    @classmethod
    def describe(cls, settings: LoadSettings, workers: int) -> str:
        return ("closed loop: each user sends its next request when the last ends; "
                f"{cls.shape(settings)}")
