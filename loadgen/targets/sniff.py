"""What a server that did not answer a target's probe speaks instead, from its first bytes, so
a run pointed at the wrong kind of server is refused in one line that says so: a gRPC server
answers an HTTP/1.1 request with an HTTP/2 frame (a SETTINGS or GOAWAY: 9 header bytes, the
fourth its type), an OpenAI-compatible one with an HTTP/1.x status line.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

HTTP2_FRAMES = (0x04, 0x07)  # SETTINGS, GOAWAY: what a gRPC server sends an HTTP/1.1 client
SNIFF_S = 2.0

GRPC = "gRPC (HTTP/2): --target moe (this project's), vllm-grpc, sglang-grpc, trtllm-grpc or triton"
HTTP1 = "HTTP/1.1, as an OpenAI-compatible server does: --target openai"


def spoken(host: str) -> str:
    """What the server at host (HOST:PORT or a URL) answers an HTTP/1.1 request in: GRPC, HTTP1,
    or "" when it cannot be told (nothing answered, or something else)."""
    url = urlsplit(host if "://" in host else f"http://{host}")
    try:
        with socket.create_connection((url.hostname, url.port or 80), timeout=SNIFF_S) as s:
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: " + url.netloc.encode()
                      + b"\r\nConnection: close\r\n\r\n")
            head = s.recv(64)
    except (OSError, ValueError):
        return ""
    if head.startswith(b"HTTP/1."):
        return HTTP1
    if len(head) >= 9 and head[3] in HTTP2_FRAMES:
        return GRPC
    return ""
