"""A small HTTP/1.1 client on asyncio streams, the openai target's in the aio sender.

It puts a request on the wire in one write, ~0.1 ms after it is asked for, where aiohttp's
client took ~0.35 ms at rest (docs/design.md, "The default client"): that time is inside every
TTFT the generator measures. It keeps connections alive in a pool with no limit (one
connection per concurrent stream, as HTTP/1.1 needs), speaks TLS where the URL is https://,
and reads a body framed by Transfer-Encoding: chunked, by Content-Length or by the connection's
close. It asks for no compression, follows no redirects and uses no proxy. A connection whose
body was not read to its end (an error reply, a stream the client left) is closed, not reused:
a new one costs ~0.6 ms more before the request reaches the server.

Failures are OSErrors (refused, reset, closed mid-reply: UNAVAILABLE to the targets) or
http.client's HTTPExceptions (a reply that is not HTTP/1.x).
"""

from __future__ import annotations

import asyncio
import http.client
import ssl
from urllib.parse import urlsplit

READ_BLOCK = 4 * 1024 * 1024  # bytes read at once; events of long contexts fit whole
LINE_LIMIT = 1024 * 1024  # the longest status, header or chunk-size line read
CHUNKED, SIZED, TO_CLOSE = "chunked", "sized", "to-close"


class NotServed(ConnectionResetError):
    """The connection closed before any byte of a reply."""


async def read_line(reader: asyncio.StreamReader, first: bool = False) -> bytes:
    """A status (the reply's first line), header, chunk-size or trailer line, with its end."""
    try:
        return await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if first and not exc.partial:
            raise NotServed("the server closed the connection without a reply") from None
        raise ConnectionResetError("the server closed the connection mid-reply") from None
    except asyncio.LimitOverrunError:
        raise http.client.HTTPException("a line of the reply is over 1 MiB") from None


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    @property
    def usable(self) -> bool:
        """Still open both ways: a server that closed an idle connection is seen here."""
        return not (self.writer.is_closing() or self.reader.at_eof())

    def close(self) -> None:
        self.writer.close()


class Response:
    """A reply's status and headers (names lower-cased), its body read as it arrives."""

    def __init__(self, pool: Pool, conn: Connection, status: int, headers: dict[str, str],
                 keep_alive: bool):
        self.pool, self.conn = pool, conn
        self.status, self.headers = status, headers
        self.keep_alive = keep_alive
        self.framing = (CHUNKED if "chunked" in headers.get("transfer-encoding", "").lower()
                        else SIZED if "content-length" in headers else TO_CLOSE)
        try:
            self.left = int(headers.get("content-length", 0)) if self.framing == SIZED else 0
        except ValueError:
            raise http.client.HTTPException(
                f"a reply's Content-Length is not a number: {headers['content-length']!r}"
            ) from None
        self.done = self.framing == SIZED and self.left == 0
        self.buffer = b""

    async def _next(self) -> bytes:
        """The body's next bytes as they came, b"" at its end."""
        if self.done:
            return b""
        reader = self.conn.reader
        try:
            if self.framing == CHUNKED:
                line = await read_line(reader)
                try:
                    size = int(line.split(b";", 1)[0], 16)
                except ValueError:
                    raise http.client.HTTPException(
                        f"a chunk of the reply has no size: {line[:100]!r}") from None
                if size == 0:
                    while (await read_line(reader)).strip():  # the trailer, if any
                        pass
                    self.done = True
                    return b""
                return (await reader.readexactly(size + 2))[:-2]  # read with its CRLF
            if self.framing == SIZED:
                data = await reader.read(min(self.left, READ_BLOCK))
                if not data:
                    raise asyncio.IncompleteReadError(b"", self.left)
                self.left -= len(data)
                self.done = not self.left
                return data
            data = await reader.read(READ_BLOCK)
            self.done = not data
            return data
        except asyncio.IncompleteReadError:
            raise ConnectionResetError("the server closed the connection mid-reply") from None

    async def readline(self) -> bytes:
        """The body's next line with its b"\\n" (the last one maybe without), b"" at its end."""
        while (end := self.buffer.find(b"\n")) < 0:
            data = await self._next()
            if not data:
                line, self.buffer = self.buffer, b""
                return line
            self.buffer += data
        line, self.buffer = self.buffer[:end + 1], self.buffer[end + 1:]
        return line

    async def read(self, limit: int) -> bytes:
        """Up to limit bytes of the body (fewer at its end)."""
        while len(self.buffer) < limit and (data := await self._next()):
            self.buffer += data
        data, self.buffer = self.buffer[:limit], self.buffer[limit:]
        return data

    async def finish(self, within_s: float) -> None:
        """Reads what is left of the body (after a stream's last event, the end of its chunks)
        so the connection can be reused; left unread past within_s."""
        try:
            async with asyncio.timeout(within_s):
                while await self._next():
                    pass
        except TimeoutError:
            pass
        self.buffer = b""

    def release(self) -> None:
        """The connection back to the pool when its body was read to the end and both sides
        keep it alive; else closed (the server sees the client leave)."""
        if self.conn is None:
            return
        if self.done and not self.buffer and self.keep_alive and self.framing != TO_CLOSE:
            self.pool.put(self.conn)
        else:
            self.conn.close()
        self.conn = None


class Pool:
    """Kept-alive connections to one server (http:// or https:// URL), as many as are used at
    once."""

    def __init__(self, url: str, tls: ssl.SSLContext | None, connect_s: float):
        """tls: an https:// server's context (the system's CAs when None)."""
        parts = urlsplit(url)
        self.tls = (tls or ssl.create_default_context()) if parts.scheme == "https" else None
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.tls else 80)
        self.authority = parts.netloc
        self.connect_s = connect_s
        self.idle: list[Connection] = []
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
        try:
            async with asyncio.timeout(self.connect_s):
                reader, writer = await asyncio.open_connection(
                    self.host, self.port, ssl=self.tls, limit=LINE_LIMIT,
                    server_hostname=self.host if self.tls else None)
        except TimeoutError:  # not the request's own deadline
            raise ConnectionError(f"no connection to {self.authority} within "
                                  f"{self.connect_s:g} s") from None
        return Connection(reader, writer)

    def put(self, conn: Connection) -> None:
        if self.closed or not conn.usable:
            conn.close()
        else:
            self.idle.append(conn)

    async def request(self, method: str, path: str, headers: dict[str, str],
                      body: bytes = b"") -> Response:
        """Sends the request and reads its reply's head; the body is the Response's to read,
        and the caller releases it. A kept-alive connection the server closed as the request
        went out (no byte of a reply: it was not served) is left for a new one, once."""
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        data = (f"{method} {path} HTTP/1.1\r\nHost: {self.authority}\r\n"
                f"User-Agent: moe-loadlab\r\nContent-Length: {len(body)}\r\n"
                f"{head}\r\n".encode("latin-1") + body)
        conn, reused = await self._connection()
        try:
            return await self._exchange(conn, data)
        except NotServed:
            if not reused:
                raise
        return await self._exchange(await self._open(), data)

    async def _exchange(self, conn: Connection, data: bytes) -> Response:
        conn.writer.write(data)
        try:
            await conn.writer.drain()
            while True:
                status, version = await self._status(conn.reader)
                fields = await self._headers(conn.reader)
                if not 100 <= status < 200:
                    break
        except BaseException:
            conn.close()
            raise
        token = fields.get("connection", "").lower()
        keep_alive = "close" not in token if version == "HTTP/1.1" else "keep-alive" in token
        return Response(self, conn, status, fields, keep_alive)

    @staticmethod
    async def _status(reader: asyncio.StreamReader) -> tuple[int, str]:
        line = await read_line(reader, first=True)
        version, _, rest = line.decode("latin-1").strip().partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise http.client.BadStatusLine(line[:100].decode("latin-1"))
        return int(code), version

    @staticmethod
    async def _headers(reader: asyncio.StreamReader) -> dict[str, str]:
        fields: dict[str, str] = {}
        while line := (await read_line(reader)).strip():
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip()
            fields[name] = f"{fields[name]}, {value}" if name in fields else value
        return fields

    async def close(self) -> None:
        self.closed = True
        for conn in self.idle:
            conn.close()
        self.idle.clear()
