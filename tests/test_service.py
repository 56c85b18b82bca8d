"""The gRPC service on a real loopback port: streaming, status codes with actionable
details for every bad input, cancellation and deadlines freeing slots, admission control,
health and reflection."""

import math
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from proto import moe_pb2
from server.engine.tokenizer import ByteTokenizer
from tests.conftest import running_server

Req = moe_pb2.GenerateRequest
LENGTH = moe_pb2.GenerateResponse.LENGTH


def stats(stub):
    return stub.GetStats(moe_pb2.GetStatsRequest())


def wait_until(predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_stream_gives_exactly_max_tokens(server):
    stub = server.stub
    msgs = list(stub.Generate(Req(prompt="hello, experts", max_tokens=10, ignore_eos=True)))
    assert sum(len(m.token_ids) for m in msgs) == 10
    assert all(m.token_ids for m in msgs)
    assert [m.finish_reason for m in msgs[:-1]] == [0] * (len(msgs) - 1)
    assert msgs[-1].finish_reason == LENGTH
    assert msgs[-1].usage.completion_tokens == 10
    assert msgs[-1].usage.prompt_tokens == len("hello, experts") + 1  # BOS
    assert msgs[-1].usage.ttft_us > 0
    elapsed = [m.server_elapsed_us for m in msgs]
    assert elapsed == sorted(elapsed) and elapsed[0] > 0


def test_greedy_is_deterministic_and_token_ids_match_text(server):
    stub = server.stub
    a = [t for m in stub.Generate(Req(prompt="abc", max_tokens=6, ignore_eos=True))
         for t in m.token_ids]
    b = [t for m in stub.Generate(Req(prompt_token_ids=ByteTokenizer().encode("abc"), max_tokens=6,
                                      ignore_eos=True))
         for t in m.token_ids]
    assert a == b and len(a) == 6


@pytest.mark.parametrize("request_, details", [
    (Req(max_tokens=4), "prompt is empty"),
    (Req(prompt="x", prompt_token_ids=[1], max_tokens=4), "not both"),
    (Req(prompt_token_ids=[1, 9999], max_tokens=4), "outside the vocabulary"),
    (Req(prompt="x", max_tokens=0), "max_tokens must be at least 1"),
    (Req(prompt="x", max_tokens=513), "--max-tokens-limit"),
    (Req(prompt="x" * 300, max_tokens=4), "shorten the prompt to at most 255 tokens"),
    (Req(prompt="x" * 200, max_tokens=100), "set max_tokens to at most 55"),
    (Req(prompt="x", max_tokens=4, temperature=-1), "temperature must be a finite number >= 0"),
    (Req(prompt="x", max_tokens=4, temperature=math.nan),
     "temperature must be a finite number >= 0"),
])
def test_bad_input_is_invalid_argument_and_server_keeps_serving(server, request_, details):
    stub = server.stub
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(request_))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details in err.value.details()
    assert len(list(stub.Generate(Req(prompt="ok", max_tokens=2, ignore_eos=True)))) >= 1


def test_cancel_mid_stream_frees_slot(server):
    stub = server.stub
    before = stats(stub).requests_aborted
    call = stub.Generate(Req(prompt="long", max_tokens=240, ignore_eos=True))
    next(call), next(call)
    assert stats(stub).kv_slots_in_use == 1
    call.cancel()
    assert wait_until(lambda: stats(stub).kv_slots_in_use == 0 and stats(stub).running == 0)
    assert stats(stub).requests_aborted == before + 1


def test_deadline_frees_slot(server):
    stub = server.stub
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(Req(prompt="long", max_tokens=240, ignore_eos=True), timeout=0.1))
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert wait_until(lambda: stats(stub).kv_slots_in_use == 0 and stats(stub).running == 0)


def test_full_queue_is_resource_exhausted():
    with running_server(max_batch_size=1, max_queue=1) as served:
        stub = served.stub
        running = stub.Generate(Req(prompt="a", max_tokens=250, ignore_eos=True))
        next(running)
        queued = stub.Generate(Req(prompt="b", max_tokens=4, ignore_eos=True))
        assert wait_until(lambda: stats(stub).waiting == 1)
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Generate(Req(prompt="c", max_tokens=4)))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-queue" in err.value.details()
        running.cancel()
        assert sum(len(m.token_ids) for m in queued) == 4
        s = stats(stub)
        assert (s.requests_rejected, s.requests_finished, s.requests_aborted) == (1, 1, 1)


def test_stats_count_work_and_reset(server):
    stub = server.stub
    stub.ResetStats(moe_pb2.ResetStatsRequest())
    list(stub.Generate(Req(prompt="count me", max_tokens=5, ignore_eos=True)))
    s = stats(stub)
    assert (s.policy, s.preset, s.requests_finished, s.tokens_generated, s.prompt_tokens) == \
        ("fcfs", "tiny", 1, 5, 9)
    assert s.steps == 5 and s.mean_batch_size == 1.0
    routed = sum(sum(layer.tokens) for layer in s.expert_tokens)
    assert routed == s.num_layers * s.top_k * (9 + 4)  # prompt + decoded tokens fed back


def test_health_and_reflection(server):
    port = server.port
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        check = health_pb2.HealthCheckRequest(service="moe.v1.MoEInference")
        reply = health_pb2_grpc.HealthStub(ch).Check(check)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        listing = reflection_pb2.ServerReflectionRequest(list_services="")
        answer = next(refl.ServerReflectionInfo(iter([listing])))
        names = {s.name for s in answer.list_services_response.service}
        assert {"moe.v1.MoEInference", "grpc.health.v1.Health"} <= names
        # reflection v1 (grpcurl asks it first): the same messages under the v1 name
        v1 = ch.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                              request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                              response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
        ask = reflection_pb2.ServerReflectionRequest(file_containing_symbol="moe.v1.MoEInference")
        files = next(v1(iter([ask]))).file_descriptor_response.file_descriptor_proto
        assert files and b"GenerateRequest" in files[0]
        assert "grpc.reflection.v1.ServerReflection" in names


def test_engine_failure_fails_requests_instead_of_hanging():
    with running_server() as served:
        def broken_step(seqs):
            raise RuntimeError("simulated kernel fault")

        served.app.service.engine_thread.engine.step = broken_step
        with pytest.raises(grpc.RpcError) as err:
            list(served.stub.Generate(Req(prompt="x", max_tokens=4), timeout=10))
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert "simulated kernel fault" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            list(served.stub.Generate(Req(prompt="x", max_tokens=4), timeout=10))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "engine is not running" in err.value.details()
        with grpc.insecure_channel(f"127.0.0.1:{served.port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            assert wait_until(lambda: health.Check(health_pb2.HealthCheckRequest()).status
                              == health_pb2.HealthCheckResponse.NOT_SERVING)


@pytest.mark.parametrize("temperature", [1e-39, 1e-6, 1e30])
def test_extreme_temperatures_sample_without_hurting_the_engine(server, temperature):
    stub = server.stub
    msgs = list(stub.Generate(Req(prompt="hot", max_tokens=4, ignore_eos=True,
                                  temperature=temperature, seed=1)))
    assert sum(len(m.token_ids) for m in msgs) == 4
    greedy = [t for m in stub.Generate(Req(prompt="hot", max_tokens=4, ignore_eos=True))
              for t in m.token_ids]
    if temperature < 1e-5:
        assert [t for m in msgs for t in m.token_ids] == greedy
