"""requests.jsonl: one line per request the load generator sent (the first --max-request-rows),
in the order they finished. Times are ms from the run's start; the server's own account
(`server_*`) is there when the stream ended with one."""

from __future__ import annotations

from dataclasses import dataclass

from records.jsonform import field

# The status of a request the client cancelled on purpose (--cancel-share): neither ok nor failed.
CLIENT_CANCELLED = "CLIENT_CANCELLED"
CUT_OFF = "CUT_OFF"  # the status of a request still streaming when the run's drain ended


@dataclass(frozen=True, kw_only=True)
class RequestRow:
    request_id: str
    request_class: str = field(key="class")  # its request class; "" without classes
    # OK, a gRPC status code name, CUT_OFF, INCOMPLETE, CLIENT_ERROR or CLIENT_CANCELLED
    status: str
    details: str
    warmup: bool  # scheduled during the warm-up: not measured
    scheduled_ms: float
    sent_ms: float | None  # None: never sent
    # when it was sent, Unix time (s): a run joins on it with a server's logs and traces, and
    # with another process's rows (request_id is what went on the wire); None: never sent
    sent_unix_s: float | None = field(None, omit=None)
    output_tokens: int
    messages: int
    ttft_ms: float | None  # None unless ok and streamed
    tpot_ms: float | None  # None unless ok and streamed with two tokens or more
    e2e_ms: float | None  # None unless ok and streamed
    # False: sent to be answered whole, for its routed experts (--routed-experts-sample): not
    # timed
    streamed: bool = field(True, omit=True)
    session: str = field("", omit="")  # the session it is a turn of (sessions mode)
    turn: int = field(0, omit=0)  # its turn there, from 1
    server_prompt_tokens: int | None = field(None, omit=None)
    server_completion_tokens: int | None = field(None, omit=None)
    server_queue_us: int | None = field(None, omit=None)
    server_prefill_us: int | None = field(None, omit=None)
    server_decode_us: int | None = field(None, omit=None)
    server_ttft_us: int | None = field(None, omit=None)
    # a thinking model's stream (the openai target): its reasoning tokens and its answer's,
    # and when each first came (ms from the scheduled send); absent without reasoning
    reasoning_tokens: int | None = field(None, omit=None)
    answer_tokens: int | None = field(None, omit=None)
    ttfr_ms: float | None = field(None, omit=None)
    ttfa_ms: float | None = field(None, omit=None)

    @property
    def measured_ok(self) -> bool:
        """In the latency histograms: finished OK, streamed and scheduled after the warm-up."""
        return self.status == "OK" and self.streamed and not self.warmup

    @property
    def finish_ms(self) -> float | None:
        """When its last message came, ms from the run's start (E2E counts from the scheduled
        send)."""
        return None if self.e2e_ms is None else self.scheduled_ms + self.e2e_ms
