"""The native mocks of loadgen/events_bench/ for tests: built here with the machine's C compiler
as the Makefile builds them, and run on a free port."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import REPO

SOURCES = REPO / "loadgen" / "events_bench"


def build(name: str, out_dir: Path) -> Path:
    """`name` (sse_mock, grpc_mock) compiled with warnings as errors."""
    out = out_dir / name
    subprocess.run(["cc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(out),
                    str(SOURCES / f"{name}.c"), str(SOURCES / "mock_core.c"), "-lm"], check=True)
    return out


@contextmanager
def mock_on(binary: Path, tmp: Path, ttft_ms: float, itl_ms: float) -> Iterator[tuple[int, Path]]:
    """The mock on a free port: yields (port, the path its account is written to at the end)."""
    port_file, stats = tmp / "port", tmp / "stats.json"
    proc = subprocess.Popen([str(binary), "--port", "0", "--port-file", str(port_file),
                             "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms),
                             "--stats", str(stats)])
    try:
        deadline = time.monotonic() + 10
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        yield int(port_file.read_text()), stats
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def check_truth(results: list, ttft_ms: float, itl_ms: float) -> None:
    """Each stream (StreamResult) as the mock says it wrote it: a true TTFT of at least its
    design's (and under twice it), seen later by the client, and every message written no
    earlier than its time."""
    for r in results:
        true_ttft_us = r.usage["ttft_us"]
        assert ttft_ms * 1e3 <= true_ttft_us < 2 * ttft_ms * 1e3
        assert (r.recv_ns[0] - r.sent_ns) / 1e3 >= true_ttft_us  # the client sees it later
        elapsed = r.server_elapsed_us  # each message's write, never before its time
        assert elapsed[0] == true_ttft_us
        assert all(e >= (ttft_ms + k * itl_ms) * 1e3 for k, e in enumerate(elapsed)), elapsed


def check_account(stats: Path, requests: int, events: int) -> None:
    """The mock's own account, written as it ended."""
    account = json.loads(stats.read_text())
    assert (account["requests"], account["events"]) == (requests, events)
    assert 4_000 < account["itl_us"]["mean"] < 20_000 and account["late_us"]["p50"] < 10_000
