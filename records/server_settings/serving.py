"""How the server serves: its listeners and device, its limits, its security, its fault
rehearsals."""

from __future__ import annotations

from dataclasses import dataclass

from records.checks import at_least, within
from records.declare import Settings, require, setting


@dataclass(frozen=True)
class Serving(Settings):
    """Serving"""

    host: str = setting("127.0.0.1", "address to listen on", compared=False)
    port: int = setting(50051, "port to listen on; 0 takes any free port",
                        check=within(0, 65535, " (0 = any free port)"), compared=False)
    port_file: str | None = setting(None, "write the bound port here once serving", compared=False)
    http_port: int | None = setting(None, "also serve the OpenAI-compatible HTTP API "
                                    "(/v1/completions, /v1/chat/completions, /v1/models, /health) "
                                    "on this port (0 = any free port); off when omitted",
                                    check=within(0, 65535, " (0 = any free port)"),
                                    compared=False)
    http_port_file: str | None = setting(None, "write the bound HTTP port here once serving",
                                         compared=False)
    enable_return_routed_experts: bool = setting(
        False, "HTTP API: each reply not streamed carries its request's routed experts as "
        "vLLM's do (routed_experts on the choice: base64 of an .npy of [tokens, layers, top-k] "
        "ids, the prompt's past the prefix cache's tokens, then the output's but the last); "
        "each step copies its tokens' expert ids to the host. Not with --ep", compared=False)
    reasoning_tokens: int = setting(0, "HTTP chat: the first N tokens of each answer stream as "
                                    "reasoning (reasoning_content deltas, a message holding the "
                                    "N-th token whole), the rest as content, as a thinking "
                                    "model's would; 0: none", check=at_least(0))
    max_queue: int = setting(1024, "waiting requests before RESOURCE_EXHAUSTED", check=at_least(1),
                             compared=False)
    max_streams_per_client: int = setting(0, "open requests (queued or running) one client may "
                                          "hold; more are refused RESOURCE_EXHAUSTED with a "
                                          "retry hint. A client is its token "
                                          "(--auth-token-file), else its address; 0: no quota",
                                          check=at_least(0, note=" (0 = no quota)"),
                                          compared=False)
    max_tokens_limit: int = setting(2048, "largest max_tokens a request may ask for",
                                    check=at_least(1), compared=False)
    grace_s: float = setting(10.0, "on SIGTERM, seconds open streams get to finish",
                             check=at_least(0), compared=False)
    metrics_port: int | None = setting(None, "serve Prometheus metrics at http://HOST:PORT/metrics "
                                       "(0 = any free port); off when omitted",
                                       check=within(0, 65535, " (0 = any free port)"),
                                       compared=False)
    step_log: str | None = setting(None, "append one JSON line per engine step (batch, stage "
                                   "times, experts per layer, wall and monotonic time) to this "
                                   "file", compared=False)


@dataclass(frozen=True)
class Limits(Settings):
    """Limits"""

    max_message_bytes: int = setting(4 * 2**20, "largest request accepted, in bytes (a gRPC "
                                     "message, an HTTP body); a bigger one is refused before it "
                                     "is read (gRPC RESOURCE_EXHAUSTED, HTTP 413)",
                                     check=at_least(1024), compared=False)
    max_concurrent_streams: int = setting(2000, "streams one gRPC connection may hold open at "
                                          "once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); the "
                                          "client holds back the rest", check=at_least(1),
                                          compared=False)
    keepalive_s: float = setting(60.0, "ping a gRPC connection idle this long, and drop it when "
                                 "the ping goes unanswered (a dead peer); 0: never",
                                 check=at_least(0), compared=False)
    max_connection_age_s: float = setting(0.0, "close each gRPC connection after this long, its "
                                          "streams given --grace-s to finish, so clients "
                                          "reconnect and spread over replicas; 0: never",
                                          check=at_least(0), compared=False)


@dataclass(frozen=True)
class Security(Settings):
    """Security (docs/security.md)"""

    tls_cert: str | None = setting(None, "serve gRPC (and the HTTP API) over TLS with this PEM "
                                   "certificate chain; needs --tls-key", compared=False)
    tls_key: str | None = setting(None, "the PEM private key of --tls-cert", compared=False)
    tls_client_ca: str | None = setting(None, "mutual TLS: accept only clients whose "
                                        "certificate this PEM CA bundle signed; needs "
                                        "--tls-cert", compared=False)
    auth_token_file: str | None = setting(None, "require a bearer token (gRPC metadata "
                                          "authorization: Bearer TOKEN; the HTTP Authorization "
                                          "header) listed in this file, one per line; a line "
                                          "'TOKEN admin' may also call ResetStats",
                                          compared=False)
    metrics_host: str | None = setting(None, "address /metrics listens on (default --host), "
                                       "e.g. 127.0.0.1 to keep it off a public interface",
                                       compared=False)
    insecure: bool = setting(False, "allow listening on an address beyond this machine "
                             "without TLS (refused otherwise)", compared=False)

    def __post_init__(self):
        super().__post_init__()
        require(bool(self.tls_cert) == bool(self.tls_key), "tls-key" if self.tls_cert
                else "tls-cert", "--tls-cert and --tls-key go together")
        require(not self.tls_client_ca or bool(self.tls_cert), "tls-client-ca",
                "needs --tls-cert and --tls-key (mutual TLS is TLS first)")


def _window(value: str) -> str | None:
    """START:END seconds, 0 <= START < END."""
    if not value:
        return None
    try:
        start, end = (float(part) for part in value.split(":"))
    except ValueError:
        return f"must be START:END in seconds, e.g. 60:120, got {value!r}"
    ok = 0 <= start < end and end < float("inf")
    return None if ok else f"must have 0 <= START < END, got {value!r}"


def window_of(value: str) -> tuple[float, float] | None:
    """A checked --fault-window's (start, end) in seconds; None: always."""
    if not value:
        return None
    start, end = (float(part) for part in value.split(":"))
    return start, end


@dataclass(frozen=True)
class Faults(Settings):
    """Fault injection (rehearsals; all off by default, docs/faults.md)"""

    fault_step_fail: float = setting(0.0, "share of engine steps that fail: their requests end "
                                     "with INTERNAL (HTTP 500) and the engine goes on",
                                     check=within(0, 1))
    fault_stall_s: float = setting(0.0, "stall the engine this long, once, when the fault window "
                                   "opens: every request waits", check=at_least(0))
    fault_drop: float = setting(0.0, "share of streams dropped after their first message "
                                "(gRPC UNAVAILABLE, an HTTP error event)", check=within(0, 1))
    fault_slow: float = setting(0.0, "share of requests whose every message is held back "
                                "--fault-slow-ms", check=within(0, 1))
    fault_slow_ms: float = setting(100.0, "delay per message of a slowed request",
                                   check=at_least(0))
    fault_window: str = setting("", "START:END: inject only between these seconds after the "
                                "server started; always when omitted", check=_window)

    @property
    def on(self) -> bool:
        return bool(self.fault_step_fail or self.fault_stall_s or self.fault_drop
                    or self.fault_slow)
