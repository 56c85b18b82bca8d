"""The server and the load generator as processes: a fresh server on a free port (it writes the
port to a file once it serves), one headless Locust run into a run directory, and the server
stopped by its PID. Output goes to files in the run directory, never to our console."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOCUSTFILE = REPO / "loadgen" / "moe.py"
START_S = 120  # a server that has not written its port by then has failed


class ProcessError(RuntimeError):
    """A server that did not start, or a run that did not end."""


def stop_process(proc: subprocess.Popen, grace_s: float = 20) -> int:
    """SIGTERM, then SIGKILL if it does not end in time (a hung gevent process ignores TERM);
    returns its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@contextmanager
def server(flags: list[str], run_dir: Path) -> Iterator[str]:
    """Yields the host ("127.0.0.1:port") of `python -m server flags`, its log in
    run_dir/server.log."""
    run_dir.mkdir(parents=True, exist_ok=True)
    port_file = run_dir / "server.port"
    port_file.unlink(missing_ok=True)
    with open(run_dir / "server.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "server", *flags, "--port", "0",
                                 "--port-file", str(port_file)], cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_S
            while not (port_file.exists() and port_file.read_text().strip()):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise ProcessError(f"the server did not start: see {run_dir / 'server.log'}")
                time.sleep(0.05)
            yield f"127.0.0.1:{port_file.read_text().strip()}"
        finally:
            stop_process(proc)


def locust(host: str, run_dir: Path, flags: list[str], limit_s: float) -> dict:
    """One headless run; returns its last JSON line (the run's headline). Its output is in
    run_dir/locust.log."""
    locust_exe = Path(sys.executable).parent / "locust"
    cmd = [str(locust_exe), "-f", str(LOCUSTFILE), "--host", host, "--headless",
           "--only-summary", "--run-dir", str(run_dir), *flags]
    with open(run_dir / "locust.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            proc.wait(limit_s)
        except subprocess.TimeoutExpired:
            stop_process(proc, grace_s=5)
            raise ProcessError(f"the run did not end in {limit_s:.0f} s: see "
                               f"{run_dir / 'locust.log'}") from None
    for line in reversed((run_dir / "locust.log").read_text().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ProcessError(f"the run ended (exit {proc.returncode}) without its summary line: see "
                       f"{run_dir / 'locust.log'}")
