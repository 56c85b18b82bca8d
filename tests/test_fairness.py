"""Fairness across clients: a per-client quota refused with a retry hint (gRPC's
grpc-retry-pushback-ms trailer, HTTP Retry-After), and admission that takes clients in turn
under every batching policy, so one client's flood does not starve another's request."""

import collections
import json
import time

import grpc
import pytest

from proto import moe_pb2
from server.scheduling.fairness import fair_order
from server.scheduling.policies import POLICIES
from tests.conftest import running_server

Req = moe_pb2.GenerateRequest
FLOOD, OTHER = "flood-token", "other-token"


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(f"{FLOOD}\n{OTHER}\n")
    return str(path)


def as_(token: str):
    return (("authorization", f"Bearer {token}"),)


class Waiting:
    def __init__(self, client: str, received_ns: int):
        self.client, self.received_ns = client, received_ns


def test_fair_order_takes_clients_in_turn_oldest_first():
    a = [Waiting("a", t) for t in (1, 2, 3, 4)]
    b = [Waiting("b", t) for t in (5, 6)]
    c = [Waiting("c", 0)]
    queue = collections.deque(sorted(a + b + c, key=lambda r: r.received_ns))
    assert fair_order(queue) == [c[0], a[0], b[0], a[1], b[1], a[2], a[3]]
    # a running two: its first waiting request ranks with the others' third
    assert fair_order(queue, [Waiting("a", -2), Waiting("a", -1)]) == [c[0], b[0], b[1], a[0],
                                                                        a[1], a[2], a[3]]
    alone = collections.deque(a)
    assert fair_order(alone) is alone  # one client: the queue itself, in arrival order


@pytest.mark.slow
@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_flooding_client_does_not_starve_another_under_every_policy(tokens, policy):
    with running_server(policy=policy, max_batch_size=2, kv_slots=2, max_wait_ms=5,
                        max_step_tokens=64, auth_token_file=tokens) as s:
        flood = [s.stub.Generate(Req(prompt="a", max_tokens=120, ignore_eos=True), timeout=60,
                                 metadata=as_(FLOOD)) for _ in range(24)]
        deadline = time.monotonic() + 10
        while s.stub.GetStats(moe_pb2.GetStatsRequest(), timeout=5,
                              metadata=as_(OTHER)).waiting < 16:
            assert time.monotonic() < deadline, "the flood did not queue"
            time.sleep(0.02)
        t0 = time.monotonic()
        next(s.stub.Generate(Req(prompt="b", max_tokens=2, ignore_eos=True), timeout=60,
                             metadata=as_(OTHER)))
        other_ttft = time.monotonic() - t0
        for c in flood:
            list(c)
        flood_left = time.monotonic() - t0
        # admitted at the first free place, not after the flood's queue
        assert other_ttft < flood_left / 4, (other_ttft, flood_left)


@pytest.mark.slow  # its held streams wait out a 3 s fault
def test_a_client_over_its_quota_gets_resource_exhausted_with_a_retry_hint(tokens):
    with running_server(max_streams_per_client=2, max_batch_size=4, fault_slow=1.0,
                        fault_slow_ms=3000, auth_token_file=tokens, http_port=0) as s:
        held = [s.stub.Generate(Req(prompt="a", max_tokens=8, ignore_eos=True), timeout=30,
                                metadata=as_(FLOOD)) for _ in range(2)]
        deadline = time.monotonic() + 10
        # both open: each message is held back 3 s
        while sum(s.app.service.admission.open_by_client.values()) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with pytest.raises(grpc.RpcError) as err:
            list(s.stub.Generate(Req(prompt="a", max_tokens=2), timeout=10, metadata=as_(FLOOD)))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-streams-per-client" in err.value.details()
        trailer = dict(err.value.trailing_metadata())
        assert int(trailer["grpc-retry-pushback-ms"]) >= 50
        assert "retry in about" in err.value.details()
        status, _, text = http_post(s.app.http_port, FLOOD)  # the quota spans both front ends
        assert status[0] == 429 and int(status[1]) >= 1
        assert "--max-streams-per-client" in json.loads(text)["error"]["message"]
        # another client is not held to the first one's quota
        assert list(s.stub.Generate(Req(prompt="b", max_tokens=1), timeout=30,
                                    metadata=as_(OTHER)))
        for c in held:
            c.cancel()


def http_post(port: int, token: str):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "a", "max_tokens": 2}),
                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    reply = conn.getresponse()
    text = reply.read().decode()
    return (reply.status, reply.getheader("Retry-After")), None, text


def test_a_full_queue_says_when_to_retry_over_http():
    # static batching waits a minute for a second request to fill its batch of 2: the first
    # holds the queue's only place
    with running_server(policy="static", max_batch_size=2, max_wait_ms=60_000, max_queue=1,
                        http_port=0) as s:
        queued = s.stub.Generate(Req(prompt="a", max_tokens=4, ignore_eos=True), timeout=30)
        deadline = time.monotonic() + 10
        while s.stub.GetStats(moe_pb2.GetStatsRequest(), timeout=5).waiting < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        status, _, text = http_post(s.app.http_port, "")
        assert status[0] == 429 and int(status[1]) >= 1
        assert "--max-queue" in json.loads(text)["error"]["message"]
        queued.cancel()
