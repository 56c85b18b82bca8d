"""The HTTP/1.1 reply decoder on its own (sans I/O): the same body whatever the reads."""

import http.client

import pytest

from loadgen.targets.http1_reply import DONE, Reply

CHUNKED = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5\r\nab\ncd\r\n3;ext=1\r\n\nef\r\n10\r\ndata: 0123456789\r\n0\r\nTrailer: x\r\n\r\n")
SIZED = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nab\ncd\n"
TO_CLOSE = b"HTTP/1.0 200 OK\r\n\r\nab\ncd"


def fed(reply: Reply, raw: bytes, size: int) -> None:
    """raw into reply, `size` bytes a read, the nth read stamped n."""
    unread = bytearray()
    for n, at in enumerate(range(0, len(raw), size), 1):
        unread += raw[at:at + size]
        reply.feed(unread, n, len(raw[at:at + size]))


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize("raw, body", [
    (CHUNKED, b"ab\ncd\nefdata: 0123456789"), (SIZED, b"ab\ncd\n"), (TO_CLOSE, b"ab\ncd")])
def test_a_body_reads_the_same_however_its_bytes_are_split(raw, body, size):
    held, sunk = Reply(), Reply()
    pieces = []
    sunk.sink = lambda data, arrived_ns: pieces.append((data, arrived_ns)) and False
    fed(held, raw, size)
    fed(sunk, raw, size)
    for reply in (held, sunk):
        reply.ended(None)
        assert reply.state == DONE and reply.error is None and reply.status == 200
    assert held.take() == body == b"".join(data for data, _ in pieces)
    # each piece stamped with the read that brought it, in order
    assert [n for _, n in pieces] == sorted(n for _, n in pieces)
    assert size < 1000 or {n for _, n in pieces} == {1}


def test_a_sink_that_stops_takes_nothing_more():
    reply, pieces = Reply(), []

    def sink(data: bytes, arrived_ns: int) -> bool:
        pieces.append(data)
        return b"cd" in data

    reply.sink = sink
    fed(reply, CHUNKED, 1000)
    assert pieces == [b"ab\ncd"] and reply.stopped


def test_a_chunk_longer_than_its_size_fails():
    reply = Reply()
    fed(reply, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n", 1)
    assert isinstance(reply.error, http.client.HTTPException)
    assert "longer than its size" in str(reply.error)
