"""One scrape of one /metrics URL: a GET with a timeout and a byte cap, the body parsed
(loadgen/scraping/exposition.py). Whatever goes wrong (refused, timed out, an HTTP error, a body
too large or not an exposition) is a failed scrape saying why, never an exception."""

from __future__ import annotations

import http.client
import ssl
import time
import urllib.error
import urllib.request

from loadgen.scraping.exposition import ExpositionError, parse
from records.server_metrics import MAX_SCRAPE_BYTES, Scrape

# The text format only: prometheus_client answers OpenMetrics to any Accept naming it, and its
# OpenMetrics writer turns the colons of vLLM's and SGLang's names into underscores in the
# samples but not in their TYPE lines (prometheus/client_python#1177), which no parser can read.
# A server that sends OpenMetrics anyway is parsed as such.
ACCEPT = "text/plain;version=0.0.4,*/*;q=0.1"


def scrape_url(url: str, timeout_s: float, started_unix_s: float,
               context: ssl.SSLContext | None = None,
               max_bytes: int = MAX_SCRAPE_BYTES) -> Scrape:
    """The scrape of url now: its families, or why there are none."""
    t_unix_s, t0 = time.time(), time.monotonic()

    def scrape(**fields) -> Scrape:
        return Scrape(t_unix_s=t_unix_s, t_run_s=t_unix_s - started_unix_s, source=url,
                      elapsed_ms=(time.monotonic() - t0) * 1e3, **fields)

    try:
        request = urllib.request.Request(url, headers={"Accept": ACCEPT})
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            length = response.headers.get("Content-Length")
            if length and length.isdigit() and int(length) > max_bytes:
                return scrape(ok=False, error=f"body of {int(length)} bytes over the "
                              f"{max_bytes >> 20} MiB cap, not read")
            body = _read(response, max_bytes, time.monotonic() + timeout_s)
            content_type = response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return scrape(ok=False, error=f"HTTP {e.code}")
    except TimeoutError:
        return scrape(ok=False, error=f"timed out after {timeout_s:g} s")
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, TimeoutError):
            return scrape(ok=False, error=f"timed out after {timeout_s:g} s")
        if isinstance(reason, ConnectionRefusedError):
            return scrape(ok=False, error="connection refused")
        return scrape(ok=False, error=f"unreachable ({reason})")
    except _TooLarge:
        return scrape(ok=False, error=f"body over the {max_bytes >> 20} MiB cap, not parsed",
                      bytes=max_bytes)
    except (OSError, ValueError, http.client.HTTPException) as e:
        # a reset connection, a broken chunked body, a reply that is not HTTP, a bad URL
        return scrape(ok=False, error=f"broken reply ({type(e).__name__}: {e})"[:160])
    try:
        families, cut = parse(body, content_type)
    except ExpositionError as e:
        return scrape(ok=False, error=str(e), bytes=len(body))
    return scrape(ok=True, bytes=len(body), families=families, cut=cut)


class _TooLarge(Exception):
    pass


def _read(response, max_bytes: int, deadline: float) -> bytes:
    """The body, refused past max_bytes or past the deadline (a server trickling bytes)."""
    parts, size = [], 0
    while chunk := response.read(64 << 10):
        size += len(chunk)
        if size > max_bytes:
            raise _TooLarge
        if time.monotonic() > deadline:
            raise TimeoutError
        parts.append(chunk)
    return b"".join(parts)
