"""loadgen/targets/http1.py, the aio sender's HTTP/1.1 client, against real sockets: the openai
reference server's streams keep one connection alive, every body framing reads whole, and a
server that breaks the reply (or is not there) fails with an OSError or an HTTPException,
which the openai target counts UNAVAILABLE."""

import asyncio
import http.client
import socket
import struct
import time

import pytest

from loadgen.targets.client import StreamResult, astream_request
from loadgen.targets.http1 import Pool
from loadgen.targets.openai import OpenAITarget
from loadgen.targets.target import RequestSpec, TargetError
from loadgen.targets.text_tokens import TextCounter
from records.declare import build
from records.load_settings import LoadSettings
from tests.conftest import delay_server_process

STREAM_BODY = b'{"prompt": [65, 65], "max_tokens": 3, "stream": true}'


class Taken:
    """A receiver (loadgen/targets/target.py's Receiver) that keeps each message it is handed,
    and when it was handed over; an HTTP stream has no fast path."""

    def __init__(self):
        self.chunks, self.handed = [], []

    def take(self, chunk) -> bool:
        self.chunks.append(chunk)
        self.handed.append(time.monotonic_ns())
        return False

    def timed(self, *message) -> bool:
        raise AssertionError(f"an HTTP stream's message came without a Chunk: {message}")


async def one_stream(pool: Pool) -> list[bytes]:
    reply = await pool.request("POST", "/v1/completions",
                               {"Content-Type": "application/json"}, STREAM_BODY)
    assert reply.status == 200 and reply.headers["content-type"] == "text/event-stream"
    lines = (await reply.read(1 << 20)).splitlines(keepends=True)
    reply.release()
    return [line for line in lines if line.startswith(b"data:")]


def test_streams_of_the_reference_server_share_one_kept_alive_connection(tmp_path):
    async def main():
        pool = Pool(f"http://127.0.0.1:{port}", None, 5)
        first = await one_stream(pool)
        conn = pool.idle[0]
        second = await one_stream(pool)
        assert pool.idle == [conn]  # the same connection, back in the pool
        await pool.close()
        return first, second

    with delay_server_process(tmp_path, "--protocol", "openai", "--ttft-ms", "1",
                              "--itl-ms", "1") as (_, port):
        first, second = asyncio.run(main())
    assert len(first) == len(second) == 4  # three tokens, then [DONE]
    assert first[-1] == second[-1] == b"data: [DONE]\n"


def test_the_openai_targets_streams_keep_their_connection_and_name_the_model(tmp_path):
    """The stream ends at [DONE]; the end of the body behind it is read in the background, so
    the connection goes back to the pool (a new one per request cost ~0.6 ms of every TTFT at
    rest). Each message is stamped when its bytes arrived, not after its parsing."""
    target = OpenAITarget(build(LoadSettings, {}).target)

    async def main():
        pool = await target.aconnect(f"127.0.0.1:{port}")
        kept = []
        for i in range(3):
            spec = RequestSpec(f"r{i}", 3, prompt_ids=(65, 65))
            taken = Taken()
            await target.apush(pool, spec, 10, taken)
            chunks, handed = taken.chunks, taken.handed
            assert [c.text for c in chunks if c.text] == ["tok "] * 3
            # each stamped as its bytes came, before they were parsed and handed over
            arrived = [c.arrived_ns for c in chunks]
            assert 0 < arrived[0] and arrived == sorted(arrived)
            assert all(a <= h for a, h in zip(arrived, handed, strict=True))
            await asyncio.gather(*pool.finishing)  # the body's end, read behind the stream
            kept.append(list(pool.idle))
        await target.aclose(pool)
        return kept

    with delay_server_process(tmp_path, "--protocol", "openai", "--ttft-ms", "1",
                              "--itl-ms", "1") as (_, port):
        kept = asyncio.run(main())
    assert target.model == "delay"  # from /v1/models, on the same pool
    assert len(kept[0]) == 1 and kept == [kept[0]] * 3


def test_the_aio_client_times_each_message_by_its_arrival(tmp_path):
    chunks = []

    class Seen(StreamResult):
        def take(self, chunk) -> bool:
            chunks.append(chunk)
            return super().take(chunk)

    target = OpenAITarget(build(LoadSettings, {}).target)

    async def main():
        pool = await target.aconnect(f"127.0.0.1:{port}")
        spec = RequestSpec("r0", 3, prompt_ids=(65, 65))
        result = Seen.of(spec, time.monotonic_ns())
        await astream_request(target, pool, spec, result, 10, TextCounter(""))
        await target.aclose(pool)
        return result

    with delay_server_process(tmp_path, "--protocol", "openai", "--ttft-ms", "1",
                              "--itl-ms", "1") as (_, port):
        result = asyncio.run(main())
    assert result.ok, result.details
    assert result.recv_ns == [c.arrived_ns for c in chunks if c.text]
    assert result.kernel_timed  # plain TCP on Linux: the kernel's receipt


async def pool_on(answer):
    """A loopback server of the handler answer, and a pool to it."""
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, Pool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", None, 5)


async def against(*replies: bytes, chunks: bool = False):
    """A server answering each connection's first request with the next reply (written a byte
    at a time when chunks, to split every read), then closing it; yields its URL's pool."""
    pending = list(replies)

    async def answer(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        reply = pending.pop(0)
        for piece in ([reply[i:i + 1] for i in range(len(reply))] if chunks else [reply]):
            writer.write(piece)
            await writer.drain()
        writer.close()

    return await pool_on(answer)


def body_of(*replies: bytes, chunks: bool = False) -> list[bytes]:
    """Each reply's body, one request after the other."""
    async def main():
        server, pool = await against(*replies, chunks=chunks)
        bodies = []
        for _ in replies:
            reply = await pool.request("GET", "/", {})
            bodies.append(await reply.read(1 << 20))
            reply.release()
        await pool.close()
        server.close()
        return bodies

    return asyncio.run(main())


CHUNKED = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5\r\nab\ncd\r\n3;ext=1\r\n\nef\r\n0\r\nTrailer: x\r\n\r\n")


@pytest.mark.parametrize("chunks", [False, True])
def test_every_framing_reads_whole_and_a_closed_idle_connection_is_not_reused(chunks):
    sized = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nab\ncd\n"
    to_close = b"HTTP/1.0 200 OK\r\n\r\nab\ncd"
    # the server closes each connection after its reply: the next request opens a new one
    assert body_of(CHUNKED, sized, to_close, chunks=chunks) == [b"ab\ncd\nef", b"ab\ncd\n",
                                                                b"ab\ncd"]


def test_a_continue_reply_is_skipped_and_read_caps_what_it_returns():
    async def main():
        server, pool = await against(b"HTTP/1.1 100 Continue\r\n\r\n" + CHUNKED)
        reply = await pool.request("POST", "/", {}, b"x")
        first = await reply.read(3)
        reply.release()  # unread body: closed, not pooled
        await pool.close()
        server.close()
        return reply.status, first, pool.idle

    assert asyncio.run(main()) == (200, b"ab\n", [])


@pytest.mark.parametrize("reply, error, words", [
    (b"", ConnectionResetError, "without a reply"),
    (b"HTTP/1.1 200 OK\r\nContent-Le", ConnectionResetError, "mid-reply"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab", ConnectionResetError, "mid-reply"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nab", ConnectionResetError,
     "mid-reply"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", http.client.HTTPException,
     "no size"),
    (b"SSH-2.0-OpenSSH\r\n\r\n", http.client.HTTPException, "SSH-2.0"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nab", http.client.HTTPException,
     "no size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nab\r\n",
     http.client.HTTPException, "no size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd\r\n",
     http.client.HTTPException, "longer than its size"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n", http.client.HTTPException,
     "not one number"),
    ("HTTP/1.1 200 OK\r\nContent-Length: \u00b2\r\n\r\n".encode(), http.client.HTTPException,
     "not one number"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nab",
     http.client.HTTPException, "not one number"),
])
def test_a_broken_reply_fails_with_what_broke(reply, error, words):
    with pytest.raises(error, match=words):
        body_of(reply)


def test_repeated_content_lengths_that_agree_are_one():
    assert body_of(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok") \
        == [b"ok"]


def test_a_stream_whole_at_done_is_whole_whatever_follows_and_its_connection_is_closed():
    """After [DONE] the body's end is read in the background: a server that closes there
    without it spoils neither the stream nor the next request."""
    event = b'data: {"choices": [{"text": "tok ", "finish_reason": "length"}]}\n\n'
    cut = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n"
           + b"%x\r\n%s\r\n" % (len(event), event) + b"e\r\ndata: [DONE]\n\n\r\n")
    target = OpenAITarget(build(LoadSettings, {}).target)

    async def main():
        server, pool = await against(cut, cut)
        streams = []
        for i in range(2):
            spec = RequestSpec(f"r{i}", 1, prompt_ids=(65,))
            taken = Taken()
            await target.apush(pool, spec, 10, taken)
            streams.append([c.finish_reason for c in taken.chunks])
            await asyncio.gather(*pool.finishing)
            assert pool.idle == []  # its end never came: closed, not kept
        server.close()
        return streams

    assert asyncio.run(main()) == [["length"], ["length"]]


def test_a_dead_host_is_refused():
    async def main():
        server, pool = await pool_on(lambda r, w: None)
        server.close()
        await server.wait_closed()
        await pool.request("GET", "/", {})

    with pytest.raises(ConnectionRefusedError):
        asyncio.run(main())


def test_a_reply_cut_at_a_chunk_boundary_is_cut_mid_reply():
    with pytest.raises(ConnectionResetError, match="mid-reply"):
        body_of(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n")


def test_a_connection_with_bytes_past_its_reply_is_not_reused():
    assert body_of(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokJUNK",
                   b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") == [b"ok", b"ok"]


def test_closing_the_pool_closes_a_connection_still_finishing_its_reply():
    async def main():
        server, pool = await against(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                     b"2\r\nab\r\n")  # its end never comes
        reply = await pool.request("GET", "/", {})
        await reply.read(2)
        reply.keep()
        reply.release()
        conn = reply.conn
        assert list(pool.finishing.values()) == [reply]
        await pool.close()
        server.close()
        return conn.transport.is_closing(), pool.finishing

    assert asyncio.run(main()) == (True, {})


def answer_once_then(after: bytes, reset: bool, connections: list):
    """A server's handler: the first request on a connection answered "ok"; on the next it
    writes after (maybe nothing) and hangs up, with an RST where reset, else a FIN."""
    async def answer(reader, writer):
        connections.append(writer)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await reader.readuntil(b"\r\n\r\n")
        if after:
            writer.write(after)
            await writer.drain()
            await asyncio.sleep(0.05)
        if reset:
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                       struct.pack("ii", 1, 0))
            writer.transport.abort()
        else:
            writer.close()

    return answer


def two_requests(answer) -> list[bytes]:
    """Two requests one after the other through one pool; their bodies."""
    async def main():
        server, pool = await pool_on(answer)
        bodies = []
        try:
            for _ in range(2):
                reply = await pool.request("GET", "/", {})
                bodies.append(await reply.read(10))
                reply.release()
        finally:
            await pool.close()
            server.close()
        return bodies

    return asyncio.run(main())


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
def test_a_request_a_kept_alive_connection_dropped_unanswered_goes_once_on_a_new_one(reset):
    connections = []
    assert two_requests(answer_once_then(b"", reset, connections)) == [b"ok", b"ok"]
    assert len(connections) == 2


@pytest.mark.parametrize("after", [b"HTTP/1.1 2", b"HTTP/1.1 100 Continue\r\n\r\n"],
                         ids=["part of a status line", "a 100 Continue"])
@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
def test_a_request_the_server_began_to_answer_is_never_sent_again(after, reset):
    connections = []
    with pytest.raises(ConnectionResetError):
        two_requests(answer_once_then(after, reset, connections))
    assert len(connections) == 1  # no second connection: not retried


def test_an_event_only_pythons_json_reads_is_read_and_a_broken_one_fails():
    """Events parse with orjson, falling back on json where orjson is stricter (NaN, an integer
    past 64 bits): what a server sends that json reads is never a failure."""
    target = OpenAITarget(build(LoadSettings, {}).target)
    chunk = target.chunk_of('{"choices": [{"text": "a", "logprobs": NaN, "finish_reason": null}],'
                            ' "seed": 123456789012345678901234567890}')
    assert chunk.text == "a"
    with pytest.raises(TargetError, match="not JSON"):
        target.chunk_of('{"choices": [')
