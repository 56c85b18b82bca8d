"""A small HTTP/1.1 client on asyncio streams, the openai target's in the aio sender.

It puts a request on the wire in one write, ~0.1 ms after it is asked for, where aiohttp's
client took ~0.35 ms at rest (docs/design.md, "The default client"): that time is inside every
TTFT the generator measures. It keeps connections alive in a pool with no limit (one
connection per concurrent stream, as HTTP/1.1 needs), speaks TLS where the URL is https://,
and reads a body framed by Transfer-Encoding: chunked, by Content-Length or by the connection's
close. It asks for no compression, follows no redirects and uses no proxy.

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
import re
import ssl
import time
from collections import deque
from urllib.parse import urlsplit

READ_BLOCK = 4 * 1024 * 1024  # bytes read at once; events of long contexts fit whole
LINE_LIMIT = 1024 * 1024  # the longest status, header or chunk-size line read
FINISH_S = 1.0  # the wait for the rest of a kept reply's body, before its connection is reused
CHUNKED, SIZED, TO_CLOSE = "chunked", "sized", "to-close"
CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
OURS = ("host", "user-agent", "content-length")  # headers the client writes itself


class NotServed(ConnectionResetError):
    """The connection closed (or was reset) before any byte of a reply."""


def buffered(reader: asyncio.StreamReader) -> int:
    """Bytes the reader holds unread (asyncio's StreamReader keeps them in _buffer)."""
    return len(reader._buffer)


async def read_line(reader: asyncio.StreamReader, first: bool = False) -> bytes:
    """A status, header, chunk-size or trailer line, with its end; NotServed where the
    connection ended before the reply's first byte (first: its first status line, not one
    after a 1xx)."""
    try:
        return await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if first and not exc.partial:
            raise NotServed("the server closed the connection without a reply") from None
        raise ConnectionResetError("the server closed the connection mid-reply") from None
    except ConnectionResetError as exc:
        if first and not buffered(reader):
            raise NotServed(f"the connection was reset before a reply: {exc}") from None
        raise
    except asyncio.LimitOverrunError:
        raise http.client.HTTPException("a line of the reply is over 1 MiB") from None


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    @property
    def usable(self) -> bool:
        """Still open both ways, with nothing unread: a server that closed an idle connection,
        or sent more than its reply, is seen here."""
        return not (self.writer.is_closing() or self.reader.at_eof()
                    or buffered(self.reader))

    def close(self) -> None:
        self.writer.close()


def content_length(headers: dict[str, str]) -> int:
    """The body's length; repeated values must agree (RFC 9112, 6.3)."""
    values = {v.strip() for v in headers["content-length"].split(",")}
    if len(values) != 1 or not ((value := values.pop()).isascii() and value.isdigit()):
        raise http.client.HTTPException(
            f"a reply's Content-Length is not one number: {headers['content-length']!r}")
    return int(value)


class Response:
    """A reply's status and headers (names lower-cased), its body read as it arrives."""

    def __init__(self, pool: Pool, conn: Connection, status: int, headers: dict[str, str],
                 keep_alive: bool):
        self.pool, self.conn = pool, conn
        self.status, self.headers = status, headers
        self.keep_alive = keep_alive
        self.framing = (CHUNKED if "chunked" in headers.get("transfer-encoding", "").lower()
                        else SIZED if "content-length" in headers else TO_CLOSE)
        self.left = content_length(headers) if self.framing == SIZED else 0
        self.done = self.framing == SIZED and self.left == 0
        self.lines: deque[tuple[bytes, int]] = deque()  # whole lines not yet taken, and
        # when the bytes that ended each arrived
        self.tail: list[bytes] = []  # the pieces of a line not yet ended
        self.line_ns = 0  # when the line readline returned last arrived
        self.kept = False

    async def _next(self) -> bytes:
        """The body's next bytes as they came, b"" at its end."""
        if self.done:
            return b""
        reader = self.conn.reader
        try:
            if self.framing == CHUNKED:
                line = await read_line(reader)
                token = line.split(b";", 1)[0].strip()  # its extensions ignored
                if not CHUNK_SIZE.fullmatch(token):
                    raise http.client.HTTPException(
                        f"a chunk of the reply has no size: {line[:100]!r}")
                if not (size := int(token, 16)):
                    while (await read_line(reader)).strip():  # the trailer, if any
                        pass
                    self.done = True
                    return b""
                data = await reader.readexactly(size + 2)  # with its CRLF
                if data[-2:] != b"\r\n":
                    raise http.client.HTTPException("a chunk of the reply is longer than its size")
                return data[:-2]
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

    def _feed(self, data: bytes, arrived_ns: int) -> None:
        """data split into lines: each byte is looked at once, however much is buffered."""
        *ended, rest = data.split(b"\n")
        if ended:
            self.tail.append(ended[0])
            self.lines.append((b"".join(self.tail) + b"\n", arrived_ns))
            self.lines.extend((line + b"\n", arrived_ns) for line in ended[1:])
            self.tail = []
        if rest:
            self.tail.append(rest)

    async def readline(self) -> bytes:
        """The body's next line with its b"\\n" (the last one maybe without), b"" at its end;
        line_ns says when it arrived, stamped as its bytes came, before anything parses them."""
        while not self.lines:
            if not (data := await self._next()):
                line, self.tail = b"".join(self.tail), []
                return line
            self._feed(data, time.monotonic_ns())
        line, self.line_ns = self.lines.popleft()
        return line

    async def read(self, limit: int) -> bytes:
        """Up to limit bytes of the body (fewer at its end)."""
        pieces = [*(line for line, _ in self.lines), *self.tail]
        self.lines.clear()
        self.tail = []
        size = sum(map(len, pieces))
        while size < limit and (data := await self._next()):
            pieces.append(data)
            size += len(data)
        data = b"".join(pieces)
        self._feed(data[limit:], time.monotonic_ns())
        return data[:limit]

    def keep(self) -> None:
        """The caller is done with the body: release reads the rest of it for the connection's
        reuse rather than closing it."""
        self.kept = True

    def release(self) -> None:
        """The connection back to the pool when its body is read to the end and both sides
        keep it alive (a kept reply's rest read first, in the background); else closed."""
        if self.conn is None:
            return
        reusable = self.keep_alive and self.framing != TO_CLOSE
        if reusable and self.done and not (self.lines or self.tail):
            self.pool.put(self.conn)
        elif reusable and self.kept and not self.done:
            self.pool.finish(self)
            return
        else:
            self.conn.close()
        self.conn = None

    async def finish(self) -> None:
        """Reads what is left of the body, then releases it; closed if that fails, takes
        longer than FINISH_S or is cancelled (the sender's end)."""
        try:
            async with asyncio.timeout(FINISH_S):
                while await self._next():
                    pass
        except (OSError, http.client.HTTPException):  # TimeoutError is an OSError
            pass
        finally:
            self.lines.clear()
            self.tail = []
            self.kept = self.kept and self.done
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
        try:
            conn.writer.write(data)
            try:
                await conn.writer.drain()
            except (ConnectionResetError, BrokenPipeError) as exc:
                raise NotServed(f"the connection was reset before a reply: {exc}") from None
            status, version = await self._status(conn.reader, first=True)
            while True:
                fields = await self._headers(conn.reader)
                if not 100 <= status < 200:
                    break
                status, version = await self._status(conn.reader, first=False)
            token = fields.get("connection", "").lower()
            keep_alive = "close" not in token if version == "HTTP/1.1" else "keep-alive" in token
            return Response(self, conn, status, fields, keep_alive)
        except BaseException:
            conn.close()
            raise

    @staticmethod
    async def _status(reader: asyncio.StreamReader, first: bool) -> tuple[int, str]:
        line = await read_line(reader, first)
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
