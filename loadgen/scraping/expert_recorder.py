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
        self.started = False
        self.copied = 0

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
        self.started = self._call("start")

    def finish(self) -> None:
        """Stops and dumps the record (if it was started), and copies the dump."""
        if not self.started:
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
        self.copied = len(fresh)

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(f"SGLang expert recorder: {p}" for p in self.problems)
