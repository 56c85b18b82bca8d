"""The gevent side of --client aio: starts loadgen/aio_sender.py, hands it the job, and turns
its result lines back into StreamResults on this process's greenlets (Locust events and
the recorder are not thread-safe, so nothing crosses over but lines of JSON)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import gevent
from gevent import subprocess
from gevent.event import Event

from loadgen.client import StreamResult
from records.declare import flat
from records.load_settings import LoadSettings


class AioSender:
    def __init__(self, on_result: Callable[[StreamResult], None]):
        """Starts the sender process now, so its imports are done before the schedule begins."""
        self.on_result = on_result
        self.not_sent = 0
        self.ended = Event()
        self.started = False
        self.proc = subprocess.Popen([sys.executable, "-m", "loadgen.aio_sender"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def start(self, settings: LoadSettings, workers: int, index: int, start_ns: int) -> None:
        self.started = True
        job = {"config": flat(settings), "workers": workers, "index": index, "start_ns": start_ns}
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()
        gevent.spawn(self._read)

    def _read(self) -> None:
        for line in self.proc.stdout:
            data = json.loads(line)
            if data.get("end"):
                self.not_sent = data["not_sent"]
                break
            self.on_result(StreamResult(**data))
        self.ended.set()

    def stop(self) -> None:
        if self.started and self.proc.poll() is None:
            self.proc.stdin.write(b"stop\n")
            self.proc.stdin.flush()

    def wait(self, timeout_s: float) -> None:
        """Until the sender has reported its drain and exited; killed past timeout_s."""
        if self.started:
            self.ended.wait(timeout_s)
        else:
            self.proc.stdin.close()  # never given a job: it exits on EOF
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
