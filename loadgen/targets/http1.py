"""A small HTTP/1.1 client on asyncio, the openai target's in the aio sender.

It puts a request on the wire in one write, ~0.1 ms after it is asked for, where aiohttp's
client took ~0.35 ms at rest (docs/design.md, "The default client"): that time is inside every
TTFT the generator measures. Each connection reads into one buffer its pool shares (asyncio's
own socket reads allocate 256 KiB a read: 12 us of an event's cost, docs/measured.md), and
hands each read to the reply being read, which decodes it there and then, stamped once
(loadgen/targets/http1_reply.py): with the time the kernel received its bytes on a plain TCP
connection (loadgen/targets/stamped_socket.py), with the time of the read over TLS (the loop's
own transport, on a buffered protocol). It keeps connections alive in a pool with
no limit (one connection per concurrent stream, as HTTP/1.1 needs), speaks TLS where the URL
is https://, and reads a body framed by Transfer-Encoding: chunked, by Content-Length or by
the connection's close. It asks for no compression, follows no redirects and uses no proxy.

A reply whose caller is done with it (`keep`: a stream that ended with [DONE]) goes back to the
pool once the rest of its body is read, in the background, so the request's result does not
wait for it: a new connection costs ~0.6 ms more before the request reaches the server. One
left unread otherwise (an error reply, a stream the client left) is closed, so the server sees
the client leave.

Failures are OSErrors (refused, reset, closed mid-reply: UNAVAILABLE to the targets) or
http.client's HTTPExceptions (a reply that is not HTTP/1.x).
"""

from __future__ import annotations

import asyncio
import http.client
import ssl
import time
from urllib.parse import urlsplit

from loadgen.targets import stamped_socket
from loadgen.targets.http1_reply import TO_CLOSE, NotServed, Reply

READ_BLOCK = 4 * 1024 * 1024  # bytes a greenlet's client reads at once (the openai target)
READ_SIZE = 256 * 1024  # bytes one socket read takes at most, into the pool's buffer
FINISH_S = 1.0  # the wait for the rest of a kept reply's body, before its connection is reused
OURS = ("host", "user-agent", "content-length")  # headers the client writes itself


class Connection(asyncio.BufferedProtocol):
    """One connection's reads, each handed to the reply being read as it arrives."""

    def __init__(self, scratch: memoryview):
        self.scratch = scratch  # the pool's read buffer: taken from at once, never kept
        self.transport: asyncio.Transport | None = None
        self.unread = bytearray()  # bytes no reply has taken
        self.reply: Reply | None = None
        self.closed = False
        self.waiter: asyncio.Future | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        # kept: asyncio.get_running_loop() asks the kernel for the process id each call
        self.loop = asyncio.get_running_loop()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.scratch

    def buffer_updated(self, nbytes: int) -> None:
        self.received(nbytes, time.monotonic_ns())  # stamped before anything parses it

    def received(self, nbytes: int, arrived_ns: int, kernel: bool = False) -> None:
        """nbytes read into scratch, arrived at arrived_ns (kernel: the kernel's time for them,
        not the read's)."""
        self.unread += self.scratch[:nbytes]
        if self.reply is not None:
            self.reply.kernel_timed = self.reply.kernel_timed and kernel
            self.reply.feed(self.unread, arrived_ns, nbytes)
        self._wake()

    def eof_received(self) -> bool:
        return False  # the transport closes: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.reply is not None:
            self.reply.ended(exc)
        self._wake()

    def _wake(self) -> None:
        """The reader waiting for a read, unless the read went to a sink that goes on: a
        streamed body wakes its reader once, at its end."""
        waiter = self.waiter
        if waiter is not None and not waiter.done() and not (
                self.reply is not None and self.reply.streaming and not self.closed):
            waiter.set_result(None)

    async def more(self) -> None:
        """Until the next read, or the connection's end."""
        if self.closed:
            return
        self.waiter = self.loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def begin(self, reply: Reply) -> None:
        """The reply to the request just written is the one its reads go to."""
        self.reply = reply
        if self.unread:  # bytes that came before the request: not an answer to it
            reply.kernel_timed = False
            reply.feed(self.unread, time.monotonic_ns(), len(self.unread))
        if self.closed:
            reply.ended(None)

    @property
    def usable(self) -> bool:
        """Still open both ways, with nothing unread: a server that closed an idle connection,
        or sent more than its reply, is seen here."""
        return not (self.closed or self.transport.is_closing() or self.unread)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Response:
    """A reply's status and headers (names lower-cased), its body read as it arrives."""

    def __init__(self, pool: Pool, conn: Connection, reply: Reply):
        self.pool, self.conn, self.reply = pool, conn, reply
        self.status, self.headers = reply.status, reply.headers
        token = reply.headers.get("connection", "").lower()
        self.keep_alive = ("close" not in token if reply.version == "HTTP/1.1"
                           else "keep-alive" in token)
        self.kept = False

    async def _more(self) -> None:
        """Until the reply has more (it raises what broke it once what came first is read)."""
        if self.reply.error is not None:
            raise self.reply.error
        await self.conn.more()

    async def read(self, limit: int) -> bytes:
        """Up to limit bytes of the body (fewer at its end)."""
        while self.reply.held < limit and not self.reply.done:
            await self._more()
        data = self.reply.take()
        self.reply.put(data[limit:], time.monotonic_ns())
        return data[:limit]

    async def consume(self, sink) -> bool:
        """Hands the body's bytes to sink(data, arrived_ns) in the read that brought them, no
        task woken a read, until sink returns True (then True) or the body ends (False)."""
        reply = self.reply
        reply.sink = sink
        reply.to_sink()  # what was held already
        while not (reply.stopped or reply.done):
            await self._more()
        if reply.error is not None and not reply.stopped:
            raise reply.error
        return reply.stopped

    def keep(self) -> None:
        """The caller is done with the body: release reads the rest of it for the connection's
        reuse rather than closing it."""
        self.kept = True

    def release(self) -> None:
        """The connection back to the pool when its body is read to the end and both sides
        keep it alive (a kept reply's rest read first, in the background); else closed."""
        if self.conn is None:
            return
        reusable = self.keep_alive and self.reply.framing != TO_CLOSE
        if reusable and self.reply.done and not self.reply.held:
            self.conn.reply = None
            self.pool.put(self.conn)
        elif reusable and self.kept and not self.reply.done:
            self.pool.finish(self)
            return
        else:
            self.conn.close()
        self.conn = None

    async def finish(self) -> None:
        """Reads what is left of the body, then releases it; closed if that fails, takes
        longer than FINISH_S or is cancelled (the sender's end)."""
        self.reply.discard = True
        self.reply.take()
        try:
            async with asyncio.timeout(FINISH_S):
                while not self.reply.done:
                    await self._more()
        except (OSError, http.client.HTTPException):  # TimeoutError is an OSError
            pass
        finally:
            self.reply.take()
            self.kept = self.kept and self.reply.done and self.reply.error is None
            self.release()


class Pool:
    """Kept-alive connections to one server (http:// or https:// URL), as many as are used at
    once."""

    def __init__(self, url: str, tls: ssl.SSLContext | None, connect_s: float):
        """tls: an https:// server's context (the system's CAs when None)."""
        parts = urlsplit(url)
        self.tls = (tls or ssl.create_default_context()) if parts.scheme == "https" else None
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.tls else 80)
        self.authority = parts.netloc.rpartition("@")[2]  # never a URL's user:password
        self.connect_s = connect_s
        self.scratch = memoryview(bytearray(READ_SIZE))  # every connection's reads, in turn
        self.idle: list[Connection] = []
        self.finishing: dict[asyncio.Task, Response] = {}
        self.closed = False

    async def _connection(self) -> tuple[Connection, bool]:
        """An idle connection still open, else a new one; and whether it was idle."""
        while self.idle:
            conn = self.idle.pop()
            if conn.usable:
                return conn, True
            conn.close()
        return await self._open(), False

    async def _open(self) -> Connection:
        """A new connection: over TLS on the loop's transport, else on a socket whose reads
        carry the kernel's time for them (loadgen/targets/stamped_socket.py)."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_s):
                if self.tls is None:
                    conn = Connection(self.scratch)
                    await stamped_socket.connect(self.host, self.port, conn)
                    return conn
                _, conn = await loop.create_connection(
                    lambda: Connection(self.scratch), self.host, self.port, ssl=self.tls,
                    server_hostname=self.host)
        except TimeoutError:  # not the request's own deadline
            raise ConnectionError(f"no connection to {self.authority} within "
                                  f"{self.connect_s:g} s") from None
        return conn

    def put(self, conn: Connection) -> None:
        if self.closed or not conn.usable:
            conn.close()
        else:
            self.idle.append(conn)

    def finish(self, response: Response) -> None:
        """Reads the rest of a kept reply's body in a task of its own, then releases it."""
        task = asyncio.get_running_loop().create_task(response.finish())
        self.finishing[task] = response
        task.add_done_callback(self.finishing.pop)

    async def request(self, method: str, path: str, headers: dict[str, str],
                      body: bytes = b"") -> Response:
        """Sends the request and reads its reply's head; the body is the Response's to read,
        and the caller releases it. A kept-alive connection the server closed or reset as the
        request went out (no byte of a reply: it was not served) is left for a new one, once.
        Content-Length is the client's own; a Host or User-Agent in headers replaces its
        own."""
        given = {k.lower(): v for k, v in headers.items()}
        fields = {"Host": given.get("host", self.authority),
                  "User-Agent": given.get("user-agent", "moe-loadlab"),
                  **{k: v for k, v in headers.items() if k.lower() not in OURS}}
        head = "".join(f"{name}: {value}\r\n" for name, value in fields.items())
        data = (f"{method} {path} HTTP/1.1\r\n{head}Content-Length: {len(body)}\r\n\r\n"
                .encode() + body)
        conn, reused = await self._connection()
        try:
            return await self._exchange(conn, data)
        except NotServed:
            if not reused:
                raise
        return await self._exchange(await self._open(), data)

    async def _exchange(self, conn: Connection, data: bytes) -> Response:
        reply = Reply()
        conn.begin(reply)
        try:
            conn.transport.write(data)
            while not reply.head_read:
                await conn.more()
            if reply.error is not None:
                raise reply.error
            return Response(self, conn, reply)
        except BaseException:
            conn.close()
            raise

    async def close(self) -> None:
        """Every idle connection closed, and those still finishing a reply."""
        self.closed = True
        finishing = dict(self.finishing)
        for task in finishing:
            task.cancel()
        await asyncio.gather(*finishing, return_exceptions=True)
        for response in finishing.values():  # one cancelled before it began
            response.kept = False
            response.release()
        for conn in self.idle:
            conn.close()
        self.idle.clear()
