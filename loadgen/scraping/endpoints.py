"""Which endpoints a run scrapes (--server-metrics): the URLs given, none with `off`, and by
default the openai target's own `{host}/metrics` when it answers as an exposition. Our own
gRPC server keeps its GetStats samples (server_stats.jsonl); the engines' gRPC targets and
Triton serve their metrics on another port, so they are scraped only when named."""

from __future__ import annotations

import ssl
import time

from loadgen.scraping.http_source import scrape_url

OFF = "off"
PROBE_TIMEOUT_S = 2.0


def given(value: str) -> list[str]:
    """The URLs --server-metrics names ([] for "" and off)."""
    if value.strip() in ("", OFF):
        return []
    return [u.strip() for u in value.split(",") if u.strip()]


def host_metrics_url(host: str) -> str:
    base = host if "://" in host else f"http://{host}"
    return base.rstrip("/") + "/metrics"


def endpoints(value: str, target: str, host: str,
              tls_ca: str = "") -> tuple[list[str] | None, str]:
    """(the URLs to scrape, None with `off`; a line for the log saying where the server side
    comes from). tls_ca: the CA bundle an https target's own /metrics is probed with."""
    if value.strip() == OFF:
        return None, "server metrics: off (--server-metrics off)"
    if urls := given(value):
        return urls, f"server metrics: scraping {', '.join(urls)}"
    if target != "openai":
        return [], ("" if target == "moe" else
                    f"server metrics: none (the {target} target serves them on another port: "
                    "name it with --server-metrics URL)")
    url = host_metrics_url(host)
    context = ssl.create_default_context(cafile=tls_ca or None) if url.startswith("https") \
        else None
    probe = scrape_url(url, PROBE_TIMEOUT_S, time.time(), context)
    if probe.ok:
        return [url], f"server metrics: scraping {url} (the target's own)"
    return [], (f"server metrics: none, {url} answered {probe.error} (the run has the client "
                "side only; --server-metrics URL names another endpoint)")
