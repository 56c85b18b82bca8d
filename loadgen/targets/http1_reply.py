"""One HTTP/1.1 reply, decoded as its bytes arrive: loadgen/targets/http1.py's connections hand
each read to the reply being read (Reply.feed) inside the event loop's read callback, stamped
with the time it arrived, before any coroutine runs. Status line, headers and the body's
framing (Transfer-Encoding: chunked, Content-Length, or to the connection's close) are parsed
there; the body comes out as the pieces each read brought, each stamped with its read's time,
so a read holding several events times them all alike and costs one clock read. A reader that
takes the body as it comes (a sink) gets each piece there too, with no coroutine woken a read.

Failures are OSErrors (closed or reset mid-reply: ConnectionResetError; NotServed where no byte
of the reply came) or http.client's HTTPExceptions (bytes that are not an HTTP/1.x reply),
raised to the reader once the body decoded before them is read.
"""

from __future__ import annotations

import http.client
import re
from collections.abc import Callable

LINE_LIMIT = 1024 * 1024  # the longest status, header or chunk-size line read
CHUNKED, SIZED, TO_CLOSE = "chunked", "sized", "to-close"
CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
STATUS, HEADERS, SIZE, DATA, TRAILER, BODY, DONE = range(7)  # where the decoding stands


class NotServed(ConnectionResetError):
    """The connection closed (or was reset) before any byte of a reply."""


def content_length(headers: dict[str, str]) -> int:
    """The body's length; repeated values must agree (RFC 9112, 6.3)."""
    values = {v.strip() for v in headers["content-length"].split(",")}
    if len(values) != 1 or not ((value := values.pop()).isascii() and value.isdigit()):
        raise http.client.HTTPException(
            f"a reply's Content-Length is not one number: {headers['content-length']!r}")
    return int(value)


class Reply:
    """A reply's head and its body, decoded from `unread` (the connection's bytes not
    yet taken) by feed."""

    def __init__(self):
        self.state = STATUS
        self.got = 0  # bytes of the reply received
        self.status, self.version = 0, ""
        self.headers: dict[str, str] = {}
        self.framing = TO_CLOSE
        self.left = 0  # a sized body's bytes, a chunk's bytes (its CRLF too), still to come
        # the body's bytes not yet taken, as they came, and when the read that brought each
        # arrived
        self.pieces: list[tuple[bytes, int]] = []
        self.held = 0  # bytes in pieces
        self.discard = False  # the body is read only to reach its end: its bytes dropped
        # where set, the body's bytes go to it as each read brings them (Response.consume);
        # it returns True to stop: the rest of the body is not read
        self.sink: Callable[[bytes, int], bool] | None = None
        self.stopped = False
        self.error: BaseException | None = None
        self.kernel_timed = True  # every read of it so far timed by the kernel's receipt

    @property
    def head_read(self) -> bool:
        return self.state > HEADERS or self.error is not None

    @property
    def streaming(self) -> bool:
        """Its body goes to a sink that has not stopped, and it is not over: a read has
        nothing to wake its reader for."""
        return (self.sink is not None and not self.stopped and self.state != DONE
                and self.error is None)

    @property
    def done(self) -> bool:
        """The body is decoded to its end (its bytes may still be held)."""
        return self.state == DONE

    def feed(self, unread: bytearray, arrived_ns: int, received: int) -> None:
        """Decodes what unread holds (received: the bytes the read added); what it took is
        deleted from it. A reply that is not HTTP, or a line its sink refused, keeps its error
        for the reader."""
        self.got += received
        try:
            taken = self._decode(unread, arrived_ns)
        except Exception as exc:  # http.client.HTTPException, or the sink's own
            self.error, taken = exc, len(unread)
        del unread[:taken]

    def _decode(self, data: bytearray, arrived_ns: int) -> int:
        pos, end = 0, len(data)
        while pos < end and self.state != DONE:
            if self.state == SIZE and (moved := self._whole_chunk(data, pos, arrived_ns)):
                pos = moved
                continue
            if self.state in (DATA, BODY):
                if (moved := self._body(data, pos, arrived_ns)) == pos:
                    break  # the rest of a chunk's end to come
                pos = moved
                continue
            eol = data.find(b"\n", pos)
            if eol < 0:
                if end - pos > LINE_LIMIT:
                    raise http.client.HTTPException("a line of the reply is over 1 MiB")
                break
            self._line(bytes(data[pos:eol + 1]))
            pos = eol + 1
        return pos

    def _whole_chunk(self, data: bytearray, pos: int, arrived_ns: int) -> int:
        """A chunk at pos that data holds whole, its size line without extensions (a streamed
        event, as servers send them), taken at once: where it ends; 0 where it is not one."""
        eol = data.find(b"\n", pos)
        token = data[pos:eol].rstrip(b"\r") if eol >= 0 else b""
        if not CHUNK_SIZE.fullmatch(token) or not (size := int(token, 16)):
            return 0
        stop = eol + 1 + size
        if data[stop:stop + 2] != b"\r\n":
            return 0
        self._body_bytes(bytes(data[eol + 1:stop]), arrived_ns)
        return stop + 2

    def _line(self, line: bytes) -> None:
        """A status, header, chunk-size or trailer line."""
        if self.state == STATUS:
            version, _, rest = line.decode("latin-1").strip().partition(" ")
            code = rest[:3]
            if not version.startswith("HTTP/1.") or not code.isdigit():
                raise http.client.BadStatusLine(line[:100].decode("latin-1"))
            self.status, self.version, self.state = int(code), version, HEADERS
            self.headers = {}
        elif self.state == HEADERS:
            if line.strip():
                name, _, value = line.decode("latin-1").partition(":")
                name, value = name.strip().lower(), value.strip()
                known = self.headers.get(name)
                self.headers[name] = f"{known}, {value}" if known is not None else value
            elif 100 <= self.status < 200:  # a 1xx: the reply is still to come
                self.state = STATUS
            else:
                self._framed()
        elif self.state == SIZE:
            token = line.split(b";", 1)[0].strip()  # its extensions ignored
            if not CHUNK_SIZE.fullmatch(token):
                raise http.client.HTTPException(f"a chunk of the reply has no size: {line[:100]!r}")
            size = int(token, 16)
            self.state, self.left = (DATA, size + 2) if size else (TRAILER, 0)
        elif not line.strip():  # TRAILER: its end
            self.state = DONE

    def _framed(self) -> None:
        """The head is read: how the body is framed."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            self.framing, self.state = CHUNKED, SIZE
        elif "content-length" in self.headers:
            self.framing, self.left = SIZED, content_length(self.headers)
            self.state = BODY if self.left else DONE
        else:
            self.framing, self.state = TO_CLOSE, BODY

    def _body(self, data: bytearray, pos: int, arrived_ns: int) -> int:
        """Body bytes from pos: what there is of a chunk (its CRLF once whole), of a sized
        body or of one read to the close."""
        if self.framing == CHUNKED:
            if (n := min(len(data) - pos, self.left - 2)) > 0:
                self._body_bytes(bytes(data[pos:pos + n]), arrived_ns)
                self.left -= n
                pos += n
            if self.left == 2 and len(data) - pos >= 2:
                if data[pos:pos + 2] != b"\r\n":
                    raise http.client.HTTPException("a chunk of the reply is longer than its size")
                self.state, self.left = SIZE, 0
                pos += 2
            return pos
        if self.framing == SIZED:
            piece = bytes(data[pos:pos + self.left])
            self.left -= len(piece)
            self.state = BODY if self.left else DONE
        else:
            piece = bytes(data[pos:])
        self._body_bytes(piece, arrived_ns)
        return pos + len(piece)

    def _body_bytes(self, data: bytes, arrived_ns: int) -> None:
        if self.discard or self.stopped:
            return
        if self.sink is not None and not self.pieces:
            self.stopped = self.sink(data, arrived_ns)
        else:
            self.pieces.append((data, arrived_ns))
            self.held += len(data)

    def to_sink(self) -> None:
        """The pieces held, to the sink, until it says stop."""
        pieces, self.pieces, self.held = self.pieces, [], 0
        for data, arrived_ns in pieces:
            if self.stopped:
                break
            self.stopped = self.sink(data, arrived_ns)

    def take(self) -> bytes:
        """Every body byte held, taken."""
        data = b"".join(data for data, _ in self.pieces)
        self.pieces, self.held = [], 0
        return data

    def put(self, data: bytes, arrived_ns: int) -> None:
        """Body bytes taken and not used, back (take took all: nothing is ahead of them)."""
        if data:
            self._body_bytes(data, arrived_ns)

    def ended(self, reset: BaseException | None) -> None:
        """The connection closed (reset: how, None for the server's close): a reply read to
        the close is whole, any other not yet done is cut."""
        if self.state == BODY and self.framing == TO_CLOSE and reset is None:
            self.state = DONE
        elif self.state != DONE and self.error is None:
            if not self.got:
                self.error = NotServed(
                    f"the connection was reset before a reply: {reset}" if reset else
                    "the server closed the connection without a reply")
            else:
                self.error = ConnectionResetError("the server closed the connection mid-reply")
