"""A plain TCP connection whose reads carry the time the kernel received their bytes: the aio
client's transport for http:// servers (loadgen/targets/http1.py), where Linux stamps them.

Each read is a recvmsg with SO_TIMESTAMPNS: the kernel hands back when the last bytes it
returns reached the machine's network stack, before this process was scheduled to read them.
A message is then timed by its arrival, not by how soon a busy event loop got to it: TTFT and
ITL keep their accuracy while the generator's loop runs late (docs/metrics.md, "Arrival
times"). Where the kernel gives no time (another OS, an option refused) a read is stamped as it
is made, as the event loop's own transports would.

It is the part of an asyncio transport the client uses: write (what the socket does not take
at once waits for it to be writable), close, is_closing; and it calls its protocol's
connection_made, received(nbytes, arrived_ns, kernel) (the bytes are in the protocol's scratch
buffer; kernel: whether arrived_ns is the kernel's) and connection_lost.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import time

# Python's socket module does not name it; the value Linux gives it on every common
# architecture (asm-generic)
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)
STAMP = struct.Struct("qq")  # a struct timespec: seconds, nanoseconds (CLOCK_REALTIME)
ANCILLARY = socket.CMSG_SPACE(STAMP.size)
LATEST_S = 1.0  # a kernel time further back than this is a clock step, not an arrival


def kernel_ns(ancillary: list, now_ns: int) -> int | None:
    """When the read's bytes reached the machine, in time.monotonic_ns()'s clock: the kernel's
    CLOCK_REALTIME stamp less the two clocks' offset now; None where it gave none."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= STAMP.size:
            seconds, nanoseconds = STAMP.unpack_from(data)
            at = seconds * 1_000_000_000 + nanoseconds - (time.time_ns() - now_ns)
            if now_ns - LATEST_S * 1e9 < at <= now_ns:
                return at
    return None


async def connect(host: str, port: int, protocol) -> StampedSocket:
    """A connection to host:port (each of its addresses in turn) for protocol."""
    loop = asyncio.get_running_loop()
    error: OSError = ConnectionRefusedError(f"{host}:{port} has no address")
    for family, kind, proto, _, address in await loop.getaddrinfo(
            host, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:  # cancelled: the request's deadline
            sock.close()
            raise
        return StampedSocket(loop, sock, protocol)
    raise error


class StampedSocket:
    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol):
        self.loop, self.sock, self.protocol = loop, sock, protocol
        self.fd = sock.fileno()
        self.buffers = [protocol.scratch]
        self.pending = bytearray()  # written, not yet taken by the socket
        self.closing = False
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if SO_TIMESTAMPNS is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            except OSError:
                pass  # stamped as read
        protocol.connection_made(self)
        loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        try:
            nbytes, ancillary, _, _ = self.sock.recvmsg_into(self.buffers, ANCILLARY)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        if not nbytes:  # the server closed its side
            self._lost(None)
            return
        now_ns = time.monotonic_ns()
        if (at_ns := kernel_ns(ancillary, now_ns)) is None:
            self.protocol.received(nbytes, now_ns, kernel=False)
        else:
            self.protocol.received(nbytes, at_ns, kernel=True)

    def write(self, data: bytes) -> None:
        if self.closing:
            return
        if not self.pending:
            try:
                data = data[self.sock.send(data):]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as exc:
                self._lost(exc)
                return
            if not data:
                return
            self.loop.add_writer(self.fd, self._writable)
        self.pending += data

    def _writable(self) -> None:
        try:
            del self.pending[:self.sock.send(self.pending)]
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        if not self.pending:
            self.loop.remove_writer(self.fd)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self._lost(None)

    def _lost(self, exc: OSError | None) -> None:
        """Closed (exc: how it broke, None for a close): the protocol told on the next turn,
        as asyncio's transports do."""
        self.closing = True
        self.loop.remove_reader(self.fd)
        self.loop.remove_writer(self.fd)
        self.sock.close()
        self.loop.call_soon(self.protocol.connection_lost, exc)
