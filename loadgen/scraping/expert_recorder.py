"""SGLang's expert distribution recorder run over a run's measured window (--expert-record-url):
/start_expert_distribution_record once the warm-up is over, /stop_expert_distribution_record and
/dump_expert_distribution_record at the end. SGLang writes the dump on its own disk
(SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR); where that folder is readable from here
(--expert-record-dir) the files it wrote are copied into the run directory's
expert_records/sglang/, else `analysis import-expert-stats` attaches them later. A call that
fails is said in the run's warnings; the run's own figures never wait on it for long."""

from __future__ import annotations

import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

from records.rundir import EXPERT_RECORDS

CALL_S = 30.0  # a dump of a long record takes a while
DUMPS = "expert_distribution_recorder_*.pt"


class ExpertRecorder:
    def __init__(self, url: str, dump_dir: str, run_dir: Path):
        self.url = url.rstrip("/")
        self.dump_dir = Path(dump_dir) if dump_dir else None
        self.run_dir = run_dir
        self.problems: list[str] = []
        self.enabled = True
        self.asked = False  # a start was sent (it may have failed, or still be on its way)
        self.starting = None  # the greenlet that starts it after the warm-up

    def _call(self, verb: str) -> bool:
        endpoint = f"{self.url}/{verb}_expert_distribution_record"
        try:
            with urllib.request.urlopen(urllib.request.Request(endpoint, method="POST"),
                                        timeout=CALL_S) as reply:
                reply.read()
            return True
        except urllib.error.HTTPError as exc:
            self.problems.append(f"{endpoint} answered HTTP {exc.code}")
        except (OSError, ValueError) as exc:
            self.problems.append(f"{endpoint} failed: {exc}")
        return False

    def start(self) -> None:
        if self.enabled:
            self.asked = True
            self._call("start")

    def finish(self) -> None:
        """Stops and dumps the record (where a start was sent: a failed one may have reached
        the server), and copies the dump. A start not sent yet (a run that ended within its
        warm-up) never is."""
        if self.starting is not None:
            self.starting.kill()  # a start not sent yet never is; one on its way is stopped
        if not self.asked:
            if self.enabled:
                self.problems.append("not started: the run ended within its warm-up")
            return
        since = time.time() - 1.0  # the server's clock is this host's when the folder is local
        if not (self._call("stop") and self._call("dump")) or self.dump_dir is None:
            return
        folder = self.run_dir / EXPERT_RECORDS / "sglang"
        fresh = [p for p in sorted(self.dump_dir.glob(DUMPS)) if p.stat().st_mtime >= since]
        if not fresh:
            self.problems.append(f"the dump left no {DUMPS} in {self.dump_dir} (is it the "
                                 "server's SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR?)")
            return
        folder.mkdir(parents=True, exist_ok=True)
        for path in fresh:
            shutil.copy2(path, folder / path.name)

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(f"SGLang expert recorder: {p}" for p in self.problems)
