"""The aio client's plain TCP transport: reads timed by the kernel's receipt, writes of any
size, closes seen."""

import asyncio
import socket
import time

import pytest

from loadgen.targets import stamped_socket


class Protocol:
    def __init__(self):
        self.scratch = memoryview(bytearray(64 * 1024))
        self.reads: list[tuple[bytes, int, int]] = []  # bytes, arrived_ns, when read
        self.kernel: list[bool] = []
        self.lost: list[BaseException | None] = []

    def connection_made(self, transport) -> None:
        self.transport = transport

    def received(self, nbytes: int, arrived_ns: int, kernel: bool) -> None:
        self.reads.append((bytes(self.scratch[:nbytes]), arrived_ns, time.monotonic_ns()))
        self.kernel.append(kernel)

    def connection_lost(self, exc) -> None:
        self.lost.append(exc)


def listening() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


@pytest.mark.skipif(stamped_socket.SO_TIMESTAMPNS is None, reason="the kernel stamps no reads")
def test_a_read_the_loop_came_to_late_is_timed_by_its_arrival():
    listener, protocol = listening(), Protocol()

    async def main():
        await stamped_socket.connect("127.0.0.1", listener.getsockname()[1], protocol)
        peer, _ = listener.accept()
        before_ns = time.monotonic_ns()
        peer.sendall(b"event")  # on loopback the kernel receives it within the call
        after_ns = time.monotonic_ns()
        time.sleep(0.05)  # the loop is busy: the read waits
        while not protocol.reads:
            await asyncio.sleep(0.001)
        peer.close()
        return before_ns, after_ns

    before_ns, after_ns = asyncio.run(main())
    (data, arrived_ns, read_ns), = protocol.reads
    assert data == b"event" and protocol.kernel == [True]
    assert read_ns - after_ns >= 50e6  # read late ...
    assert before_ns - 1e6 <= arrived_ns <= after_ns + 1e6  # ... timed as it arrived


def test_a_write_larger_than_the_socket_takes_goes_whole_and_a_close_is_seen():
    listener, protocol = listening(), Protocol()
    body = bytes(range(256)) * 40_000  # 10 MB: past any socket buffer

    async def main():
        transport = await stamped_socket.connect("127.0.0.1", listener.getsockname()[1],
                                                 protocol)
        peer, _ = listener.accept()
        peer.setblocking(False)
        transport.write(body[:1000])
        transport.write(body[1000:])
        got = bytearray()
        while len(got) < len(body):
            try:
                got += peer.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.001)
        peer.close()  # the server closes: the client sees it
        while not protocol.lost:
            await asyncio.sleep(0.001)
        return bytes(got), transport

    got, transport = asyncio.run(main())
    assert got == body and protocol.lost == [None] and transport.is_closing()


def test_a_refused_connection_raises():
    with pytest.raises(ConnectionRefusedError):  # nothing listens on port 9 here
        asyncio.run(stamped_socket.connect("127.0.0.1", 9, Protocol()))
