"""A /metrics server with every way an endpoint goes wrong, on 127.0.0.1, for the tests of
scraping: a good exposition, 404, 500, HTML, garbage, 50 MB (announced, or streamed without a
length), one that answers too late, and one that fails every other scrape."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

EXPOSITIONS = Path(__file__).parent / "fixtures" / "expositions"
HUGE = 50 << 20
SLOW_S = 3.0


def refused_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def metrics_endpoints():
    """Yields the base URL http://127.0.0.1:PORT of the server."""
    good = (EXPOSITIONS / "vllm.prom").read_bytes()
    flips = itertools.count()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, status: int, body: bytes, kind: str = "text/plain; version=0.0.4",
                  length: int | None = None):
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            path = self.path
            if path == "/metrics":
                self.reply(200, good)
            elif path == "/500":
                self.reply(500, b"internal error")
            elif path == "/html":
                self.reply(200, b"<!doctype html><html><body>login</body></html>", "text/html")
            elif path == "/garbage":
                self.reply(200, b"this is not { prometheus\n\x00\x01 at all\n")
            elif path == "/huge":
                self.reply(200, b"x" * 1024, length=HUGE)
            elif path == "/huge-stream":
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                line = b"# padding comment line of a big exposition\n" * 1024
                try:
                    for _ in range(HUGE // len(line) + 1):
                        self.wfile.write(line)
                except OSError:  # the scraper hung up at its cap
                    pass
            elif path == "/slow":
                time.sleep(SLOW_S)
                self.reply(200, good)
            elif path == "/flaky":
                if next(flips) % 2:
                    self.reply(503, b"busy")
                else:
                    self.reply(200, good)
            else:
                self.reply(404, b"not found")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
