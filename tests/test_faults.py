"""Fault injection (--fault-*): each fault does what it says on a real server, the engine goes
on serving, every request ends in a status, and GetStats counts what was injected."""

import time

import grpc
import pytest

from proto import moe_pb2
from records.declare import SettingsError, build
from records.server_settings import ServerSettings
from tests.conftest import running_server
from tests.test_http_api import call, events

Req = moe_pb2.GenerateRequest


def ask(stub, tokens: int = 4) -> list:
    return list(stub.Generate(Req(prompt="hi", max_tokens=tokens, ignore_eos=True), timeout=30))


def faults(stub) -> moe_pb2.FaultCounts:
    return stub.GetStats(moe_pb2.GetStatsRequest(), timeout=5).faults


def test_failed_steps_end_their_requests_as_internal_and_the_engine_goes_on():
    with running_server(fault_step_fail=1.0, fault_window="0:2") as s:
        with pytest.raises(grpc.RpcError) as err:
            ask(s.stub)
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert "--fault-step-fail" in err.value.details()
        counts = faults(s.stub)
        assert counts.steps_failed >= 1 and counts.active
        while faults(s.stub).active:
            time.sleep(0.1)
        assert len(ask(s.stub)) >= 1  # the window closed: served again
        assert slots_freed(s.stub)
        stats = s.stub.GetStats(moe_pb2.GetStatsRequest(), timeout=5)
        assert stats.settings["fault_step_fail"] == "1.0"


def test_dropped_streams_fail_unavailable_after_their_first_message_on_both_front_ends():
    with running_server(fault_drop=1.0, http_port=0) as s:
        got = []
        with pytest.raises(grpc.RpcError) as err:
            for msg in s.stub.Generate(Req(prompt="hi", max_tokens=20, ignore_eos=True),
                                       timeout=30):
                got.append(msg)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "--fault-drop" in err.value.details() and len(got) == 1
        status, _, text = call(s.app.http_port, "POST", "/v1/completions",
                               {"prompt": "hi", "max_tokens": 20, "stream": True,
                                "ignore_eos": True})
        assert status == 200 and events(text)[-1]["error"]["code"] == 503
        counts = faults(s.stub)
        assert counts.streams_dropped == 2
        assert slots_freed(s.stub)


def slots_freed(stub, timeout_s: float = 5) -> bool:
    """Once the cancels of dropped streams are reaped (before the engine's next step)."""
    deadline = time.monotonic() + timeout_s
    while stub.GetStats(moe_pb2.GetStatsRequest(), timeout=5).kv_slots_in_use:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_slowed_requests_hold_each_message_back():
    with running_server(fault_slow=1.0, fault_slow_ms=200) as s:
        t0 = time.monotonic()
        assert len(ask(s.stub, tokens=3)) >= 1
        assert time.monotonic() - t0 >= 0.2
        assert faults(s.stub).requests_slowed == 1


def test_a_stall_holds_the_engine_once_when_the_window_opens():
    with running_server(fault_stall_s=0.5) as s:
        t0 = time.monotonic()
        ask(s.stub)
        first = time.monotonic() - t0
        t0 = time.monotonic()
        ask(s.stub)
        assert first >= 0.5 > time.monotonic() - t0
        counts = faults(s.stub)
        assert counts.stalls == 1 and counts.stall_s == 0.5


def test_no_faults_by_default(server):
    ask(server.stub)
    assert faults(server.stub) == moe_pb2.FaultCounts()


@pytest.mark.parametrize(("name", "value"), [("fault_window", "5"), ("fault_window", "9:3"),
                                             ("fault_drop", 1.5), ("fault_step_fail", -0.1)])
def test_bad_fault_settings_name_the_flag(name, value):
    with pytest.raises(SettingsError, match=f"--{name.replace('_', '-')}"):
        build(ServerSettings, {name: value})
