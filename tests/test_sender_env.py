"""The aio sender's process (loadgen/aio_client.py, `_spawn`) runs grpc with its reads and
writes on the thread that hands them to the event loop (SENDER_ENV), and a GRPC_EXPERIMENTS of
the user's own reaches it unchanged."""

from pathlib import Path

import pytest

from loadgen import aio_client


@pytest.mark.parametrize(("given", "seen"), [(None, "-event_engine_client"),
                                             ("-event_engine_dns", "-event_engine_dns")])
def test_the_sender_runs_grpc_without_event_engines_pool_unless_the_user_says(monkeypatch,
                                                                               given, seen):
    if given is None:
        monkeypatch.delenv("GRPC_EXPERIMENTS", raising=False)
    else:
        monkeypatch.setenv("GRPC_EXPERIMENTS", given)
    sender = aio_client._spawn()
    try:
        environ = Path(f"/proc/{sender.pid}/environ").read_bytes().split(b"\0")
    finally:
        sender.stdin.close()  # no job: it exits
        sender.wait()
    assert f"GRPC_EXPERIMENTS={seen}".encode() in environ
    assert sender.returncode == 0
