"""The native mocks (sse_mock, grpc_mock: built by `make bench-loadgen` into .build/) run for a
benchmark, and the truth they report: each request's true TTFT in its usage, which the load
generator keeps as server_ttft_us (requests.jsonl)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BUILD = Path(__file__).resolve().parents[2] / ".build"
# the mock yields a core to the generator when both want one: its own lateness is in the truth
MOCK_NICE = 10


@contextmanager
def native_mock(name: str, tmp: Path, ttft_ms: float, itl_ms: float) -> Iterator[tuple[int, Path]]:
    """The mock `name` on a free port, niced: yields (port, the path of its account, written
    when it ends)."""
    binary = BUILD / name
    if not binary.exists():
        raise SystemExit(f"{binary} is missing: make bench-loadgen builds it")
    port_file, stats = tmp / f"{name}.port", tmp / f"{name}.json"
    port_file.unlink(missing_ok=True)
    mock = subprocess.Popen(["nice", "-n", str(MOCK_NICE), str(binary), "--port", "0",
                             "--port-file", str(port_file), "--ttft-ms", str(ttft_ms),
                             "--itl-ms", str(itl_ms), "--stats", str(stats)])
    try:
        deadline = time.monotonic() + 10
        while not port_file.exists():
            if time.monotonic() > deadline or mock.poll() is not None:
                raise SystemExit(f"{binary} did not start (exit {mock.poll()})")
            time.sleep(0.02)
        yield int(port_file.read_text()), stats
    finally:
        mock.terminate()
        mock.wait(timeout=10)


def ttft_errors(run_dir: Path) -> list[float]:
    """Each measured ok request's TTFT less the mock's true one (ms)."""
    errors = []
    for line in (run_dir / "requests.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["status"] == "OK" and not row["warmup"] and row.get("server_ttft_us"):
            errors.append(row["ttft_ms"] - row["server_ttft_us"] / 1e3)
    return errors
