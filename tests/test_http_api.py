"""The OpenAI-compatible HTTP API (`--http-port`) on a real loopback port: the same tokens as
the gRPC service, streamed as server-sent events or whole, OpenAI-shaped errors for every bad
input (400, 404, 405, 429, 503) with the server serving on, a client that leaves freeing its
slot, and a drain that lets open streams finish; /metrics beside the API, the usage holding the
server's own times."""

import http.client
import json
import signal
import threading

import pytest

from loadgen.targets.openai import OpenAITarget
from proto import moe_pb2
from records.declare import build
from records.load_settings import LoadSettings
from server.frontends.admission import Batch
from server.frontends.http_api import CompletionResponse, call_of
from tests.conftest import running_server, server_process
from tests.test_service import stats, wait_until


@pytest.fixture(scope="module")
def served():
    with running_server(max_batch_size=4, max_tokens_limit=512, http_port=0) as s:
        yield s


def call(port: int, method: str, path: str, body=None) -> tuple[int, str, str]:
    """(status, content type, body text) of one request."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    data = body if isinstance(body, bytes | str) or body is None else json.dumps(body)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    return response.status, response.getheader("Content-Type", ""), text


def events(text: str) -> list:
    """The data of each server-sent event, JSON decoded but for [DONE]."""
    data = [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


def test_models_and_health_name_the_served_model(served):
    status, _, text = call(served.app.http_port, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(text)["data"]] == ["tiny"]
    assert call(served.app.http_port, "GET", "/health")[0] == 200


def test_a_whole_completion_has_exactly_max_tokens_and_the_grpc_services_tokens(served):
    body = {"model": "tiny", "prompt": "hello, experts", "max_tokens": 7, "ignore_eos": True,
            "temperature": 0, "return_token_ids": True}
    status, kind, text = call(served.app.http_port, "POST", "/v1/completions", body)
    assert status == 200 and kind.startswith("application/json")
    reply = json.loads(text)
    usage = reply["usage"]
    assert {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == {
        "prompt_tokens": 15, "completion_tokens": 7, "total_tokens": 22}
    # the server's own times, as its gRPC Usage has them
    assert usage["prefill_us"] > 0 and usage["decode_us"] > 0 and usage["queue_us"] >= 0
    assert usage["ttft_us"] >= usage["prefill_us"]
    assert reply["choices"][0]["finish_reason"] == "length"
    over_grpc = [t for m in served.stub.Generate(moe_pb2.GenerateRequest(
        prompt="hello, experts", max_tokens=7, ignore_eos=True)) for t in m.token_ids]
    assert reply["choices"][0]["token_ids"] == over_grpc


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_stream_is_server_sent_events_with_usage_then_done(served, path):
    prompt = ({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path
              else {"prompt": [72, 105]})  # token ids
    body = {**prompt, "max_tokens": 9, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}
    status, kind, text = call(served.app.http_port, "POST", path, body)
    assert status == 200 and kind.startswith("text/event-stream")
    got = events(text)
    assert got[-1] == "[DONE]" and got[-2]["choices"] == []
    assert got[-2]["usage"]["completion_tokens"] == 9
    chunks = got[:-2]
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == 9
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    elapsed = [c["server_elapsed_us"] for c in chunks]
    assert elapsed == sorted(elapsed) and elapsed[0] > 0
    if "chat" in path:
        assert chunks[0]["object"] == "chat.completion.chunk"
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"


@pytest.mark.parametrize(("method", "path", "body", "status", "says"), [
    ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "at least 1"),
    ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 10_000}, 400,
     "--max-tokens-limit"),
    ("POST", "/v1/completions", {"prompt": "x", "max_tokens": True}, 400, "max_tokens must be"),
    ("POST", "/v1/completions", {"max_tokens": 4}, 400, "prompt is missing"),
    ("POST", "/v1/completions", {"prompt": [1, 999_999]}, 400, "outside the vocabulary"),
    ("POST", "/v1/completions", {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("POST", "/v1/completions", {"prompt": "x", "n": 2}, 400, "one choice"),
    ("POST", "/v1/completions", b"{not json", 400, "not JSON"),
    ("POST", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("POST", "/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, "does not exist"),
    ("POST", "/v1/complete", {"prompt": "x"}, 404, "/v1/completions"),
    ("GET", "/v1/completions", None, 405, "use POST"),
])
def test_bad_input_gets_an_openai_error_and_the_server_keeps_serving(served, method, path, body,
                                                                     status, says):
    got, kind, text = call(served.app.http_port, method, path, body)
    error = json.loads(text)["error"]
    assert (got, error["code"]) == (status, status) and says in error["message"], text
    assert kind.startswith("application/json")
    ok = call(served.app.http_port, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert ok[0] == 200


def test_a_full_queue_is_429_and_a_client_that_leaves_frees_its_slot():
    with running_server(max_batch_size=1, max_queue=1, http_port=0) as s:
        port = s.app.http_port
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/v1/completions", json.dumps(
            {"prompt": "a", "max_tokens": 250, "ignore_eos": True, "stream": True}))
        running = conn.getresponse()
        running.readline()  # streaming: it holds the only slot
        queued = threading.Thread(target=call, args=(port, "POST", "/v1/completions",
                                                     {"prompt": "b", "max_tokens": 4}))
        queued.start()
        assert wait_until(lambda: stats(s.stub).waiting == 1)
        status, _, text = call(port, "POST", "/v1/completions", {"prompt": "c", "max_tokens": 4})
        assert status == 429 and "--max-queue" in json.loads(text)["error"]["message"]
        conn.close()  # the client leaves mid-stream
        queued.join(timeout=30)
        assert not queued.is_alive()
        assert wait_until(lambda: stats(s.stub).requests_aborted == 1)
        assert stats(s.stub).requests_rejected == 1


@pytest.mark.slow
def test_sigterm_refuses_new_requests_with_503_and_lets_open_streams_finish(tmp_path):
    http_port_file = tmp_path / "http.port"
    with server_process(tmp_path, "--http-port", "0", "--http-port-file", str(http_port_file),
                        "--grace-s", "10") as (proc, _):
        port = int(http_port_file.read_text())
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/v1/completions", json.dumps(
            {"prompt": "a", "max_tokens": 100, "ignore_eos": True, "stream": True}))
        streaming = conn.getresponse()
        streaming.readline()
        proc.send_signal(signal.SIGTERM)
        assert wait_until(lambda: call(port, "GET", "/health")[0] == 503)
        status, _, text = call(port, "POST", "/v1/completions", {"prompt": "x"})
        assert status == 503 and "shutting down" in text
        got = events(streaming.read().decode())
        assert got[-1] == "[DONE]" and got[-2]["choices"][0]["finish_reason"] == "length"
        assert proc.wait(timeout=20) == 0


def test_reasoning_tokens_stream_first_as_reasoning_content_on_chat_only():
    with running_server(max_batch_size=2, http_port=0, reasoning_tokens=3) as s:
        body = {"messages": [{"role": "user", "content": "think"}], "max_tokens": 8,
                "ignore_eos": True, "stream": True, "return_token_ids": True}
        status, _, text = call(s.app.http_port, "POST", "/v1/chat/completions", body)
        whole = json.loads(call(s.app.http_port, "POST", "/v1/chat/completions",
                                {**body, "stream": False})[2])
        plain = events(call(s.app.http_port, "POST", "/v1/completions",
                            {"prompt": "x", "max_tokens": 4, "stream": True})[2])
    assert status == 200
    chunks = [c["choices"][0] for c in events(text)[:-1]]
    kinds = ["reasoning_content" in c["delta"] for c in chunks]
    assert kinds[0] and not kinds[-1] and kinds == sorted(kinds, reverse=True)  # then the answer
    before = [sum(len(c["token_ids"]) for c in chunks[:i]) for i in range(len(chunks))]
    first_answer = kinds.index(False)
    assert before[first_answer] >= 3 and before[first_answer - 1] < 3  # the 3rd token's message
    assert sum(len(c["token_ids"]) for c in chunks) == 8
    # the load generator's openai target tells the two apart
    target = OpenAITarget(build(LoadSettings, {"endpoint": "/v1/chat/completions",
                                               "token_ids": True}).target)
    assert [target.chunk_of(json.dumps({"choices": [c]})).reasoning for c in chunks] == kinds
    message = whole["choices"][0]["message"]
    assert message["reasoning_content"] and "content" in message
    assert all("text" in c["choices"][0] for c in plain[:-1] if c["choices"])


def test_a_reasoning_batch_whose_character_is_held_back_is_still_reasoning():
    call = call_of({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                    "stream": True, "return_token_ids": True}, True, "m")
    answer = CompletionResponse(call, "m", 0, reasoning_tokens=2)
    held = Batch([195], "")  # the first byte of a two-byte character: no text yet
    thinking = answer.thinking(held)
    delta = answer.choice(held, first=True, streamed=True, thinking=thinking)["delta"]
    assert thinking and delta == {"role": "assistant", "reasoning_content": ""}
    assert answer.thinking(Batch([169], "é")) and not answer.thinking(Batch([65], "A"))


def test_metrics_beside_the_api_are_the_metrics_ports():
    with running_server(http_port=0, metrics_port=0) as s:
        list(s.stub.Generate(moe_pb2.GenerateRequest(prompt="hi", max_tokens=3, ignore_eos=True)))
        beside = call(s.app.http_port, "GET", "/metrics")
        own = call(s.app.metrics_port, "GET", "/metrics")
    assert beside[0] == 200 and beside[1].startswith("text/plain")

    def families(text: str) -> set[str]:
        return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}

    assert families(beside[2]) == families(own[2])
    assert {"moe_steps_total", "moe_gpu_busy_seconds_total"} <= families(beside[2])
