"""Per-request latency metrics from monotonic timestamps (docs/metrics.md).

Open-loop times count from the scheduled send, so a late generator or a stalled server
cannot hide its delay; the `_service` variants count from the actual send.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StreamTiming:
    ttft_us: int  # scheduled send -> first message
    ttft_service_us: int  # actual send -> first message
    e2e_us: int  # scheduled send -> last message
    e2e_service_us: int  # actual send -> last message
    itl_us: list[int]  # between consecutive messages
    itl_token_us: list[float]  # per token: each gap spread over the tokens that arrived in it
    tpot_us: float | None  # (e2e - ttft) / (tokens - 1); None for one-token requests
    output_tokens: int
    send_lag_us: int  # scheduled -> actual send: the generator's own lateness
    # per message: client-measured time minus the server's (transit + client lag)
    delivery_lag_us: list[int]


def stream_timing(scheduled_ns: int, sent_ns: int, recv_ns: list[int], tokens: list[int],
                  server_elapsed_us: list[int] | None = None) -> StreamTiming:
    """recv_ns[i] is when message i arrived, tokens[i] how many tokens it carried and
    server_elapsed_us[i] the server's time from receiving the request to emitting it (a
    duration, so the two hosts' clocks need not agree)."""
    if not recv_ns or len(recv_ns) != len(tokens):
        raise ValueError("need one token count per received message, and at least one message")
    first, last = recv_ns[0], recv_ns[-1]
    n = sum(tokens)
    gaps = [(b - a) // 1000 for a, b in zip(recv_ns, recv_ns[1:], strict=False)]
    ttft = (first - scheduled_ns) // 1000
    e2e = (last - scheduled_ns) // 1000
    return StreamTiming(
        ttft_us=ttft,
        ttft_service_us=(first - sent_ns) // 1000,
        e2e_us=e2e,
        e2e_service_us=(last - sent_ns) // 1000,
        itl_us=gaps,
        itl_token_us=[gap / k for gap, k in zip(gaps, tokens[1:], strict=True) for _ in range(k)],
        tpot_us=(e2e - ttft) / (n - 1) if n > 1 else None,
        output_tokens=n,
        send_lag_us=(sent_ns - scheduled_ns) // 1000,
        delivery_lag_us=[(r - sent_ns) // 1000 - e
                         for r, e in zip(recv_ns, server_elapsed_us or [], strict=False) if e],
    )
