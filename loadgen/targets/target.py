"""Targets: what the load generator needs from a server protocol, and the registry of them.

A target is one small class holding everything protocol-specific: it builds the protocol's
request from the workload's neutral `RequestSpec`, streams it (a blocking version for Locust's
greenlets and an async one for the aio sender), turns each streamed message into a `Chunk`,
maps errors onto one status vocabulary (docs/metrics.md) and probes readiness. Modes,
arrivals, recording, distribution and analysis never ask which target runs.

Targets load by name when first used, so a run imports only its own protocol's client.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from records.declare import leaves
from records.load_settings import LoadSettings, TargetSettings
from records.load_settings.choices import Mode
from records.server_stats import ServerStats

# name -> module:Class; adding a target is its class and a line here.
TARGETS = {
    "moe": "loadgen.targets.moe:MoeTarget",
    "openai": "loadgen.targets.openai:OpenAITarget",
    "vllm-grpc": "loadgen.targets.engines:VllmTarget",
    "sglang-grpc": "loadgen.targets.engines:SglangTarget",
    "trtllm-grpc": "loadgen.targets.engines:TrtllmTarget",
    "triton": "loadgen.targets.triton:TritonTarget",
}


@dataclass(frozen=True)
class RequestSpec:
    """What the workload asks of one request, whatever the protocol."""

    request_id: str
    max_tokens: int  # output tokens; exact where the protocol can ignore end-of-sequence
    prompt_ids: tuple[int, ...] = ()  # token ids of printable bytes (synthetic prompts) ...
    prompt_text: str = ""  # ... or text (a dataset's prompts); one of the two is set
    request_class: str = ""  # the request class, "" without classes
    cancel_after: int = 0  # the client cancels once this many output tokens arrived; 0: never
    session: str = ""  # the session it is a turn of (--mode sessions), "" none: sent as
    # X-Session-ID over HTTP and session_id metadata over gRPC, for the server's affinity
    turn: int = 0  # its turn in the session, from 1
    # a session's conversation as texts, user and assistant by turns, ending with the new
    # message: chat endpoints send it as messages (the prompt is its concatenation)
    dialogue: tuple[str, ...] = ()
    # False: sent to be answered in one reply, not streamed, for the routed experts only such a
    # reply carries (--routed-experts-sample; the openai target, where the server answers)
    stream: bool = True

    @property
    def prompt_units(self) -> tuple:
        """The prompt as the units a server caches by: its token ids, or a text's words (a
        tokenizer's blocks fall near enough for what a run could share)."""
        return self.prompt_ids or tuple(self.prompt_text.split())

    @property
    def text(self) -> str:
        """The prompt as text: for ids, the bytes they stand for (synthetic prompts are ASCII)."""
        return self.prompt_text or bytes(self.prompt_ids).decode("ascii", errors="replace")


@dataclass(kw_only=True)
class Chunk:
    """One streamed message, as the load generator records it."""

    tokens: int = 0  # output tokens it carries, where the protocol says (ids, a count) ...
    text: str = ""  # ... or the text it carries, counted when the stream ends (text_tokens.py)
    server_elapsed_us: int = 0  # the server's time from the request to this message; 0 unknown
    finish_reason: str = ""  # set on the message that ends the stream
    reasoning: bool = False  # it carries reasoning (a thinking model's), no answer yet
    # its output token ids where the protocol streams them, and their text where it streams
    # that beside them: kept for a session's history only
    ids: Sequence[int] = ()
    history_text: str = ""
    # the server's own account, on the last message; keys as RequestRow's server_* fields
    usage: dict[str, int] = field(default_factory=dict)
    # when its bytes reached the client, where its reader stamps them before parsing (the aio
    # sender's HTTP/1.1 client); 0: it is stamped as it is handed over
    arrived_ns: int = 0
    # the bytes it took: a protobuf message's serialized size, an event's lines (set by the
    # stream that read it; framing below the message, HTTP/2's or HTTP/1.1's, not counted)
    size: int = 0
    # where it carries routed experts: its JSON text, read once the stream has ended
    # (loadgen/targets/routed_experts.py); "" none
    routed: str = ""
    # the whole reply, not streamed (RequestSpec.stream): its tokens came at once, so it has
    # no TTFT, TPOT or ITL of its own
    whole: bool = False


class Receiver(Protocol):
    """Where the aio sender's streams hand their messages as they arrive (its StreamResult).
    Each call returns True when the client leaves the stream now (it cancels)."""

    def take(self, chunk: Chunk) -> bool:
        """A message, at chunk.arrived_ns (0: now)."""

    def timed(self, arrived_ns: int, tokens: int, server_elapsed_us: int, size: int) -> bool:
        """A message that carries output tokens and nothing else the run keeps (most of a
        stream's), handed over without a Chunk: its arrival, its tokens, the server's time for
        it (0 unknown) and its bytes."""


class TargetError(Exception):
    """A protocol-level failure: the status (docs/metrics.md) and what happened."""

    def __init__(self, status: str, details: str):
        super().__init__(f"{status}: {details}")
        self.status, self.details = status, details


class Target(Protocol):
    name: ClassVar[str]
    over_http: ClassVar[bool]  # --host is http://HOST:PORT (or HOST:PORT) rather than HOST:PORT
    takes_text: ClassVar[bool]  # prompts may go as text; else as token ids only
    replies_text: ClassVar[bool]  # its messages carry the reply's text (else its ids only)
    required: ClassVar[tuple[str, ...]]  # Target settings it cannot run without
    streams_text: bool  # its messages carry text, counted by loadgen/targets/text_tokens.py
    asks_routing: bool  # its requests ask for the routed experts (openai, --routed-experts)

    def connect(self, host: str) -> Any:
        """A connection for one Locust user (a channel, an HTTP pool), used from greenlets."""

    def stream(self, conn: Any, spec: RequestSpec, timeout_s: float) -> Iterator[Chunk]:
        """The request's messages as they arrive; raises on failure (see `failure`)."""

    async def aconnect(self, host: str) -> Any:
        """A connection for the aio sender, on its event loop."""

    async def apush(self, conn: Any, spec: RequestSpec, timeout_s: float,
                    receiver: Receiver) -> bool:
        """`stream` on asyncio: each message handed to the receiver as it arrives, with its
        arrival time; returns whether every message was timed by the kernel's receipt
        (docs/metrics.md, "Arrival times"). Raises on failure."""

    def close(self, conn: Any) -> None: ...

    async def aclose(self, conn: Any) -> None: ...

    def failure(self, exc: BaseException) -> tuple[str, str]:
        """(status, details) of an exception `stream` raised."""

    def probe(self, host: str) -> str:
        """Why the server is not ready ("" when it is), in one line naming host and protocol."""

    def stats(self, host: str) -> ServerStats | None:
        """The server's telemetry (GetStats), or None when the protocol has none."""


class MissingPackage(ImportError):
    """A target's optional package is not installed; the message says how to install it."""


def target_class(name: str) -> type[Target]:
    """The target's class, its module imported now: only the target a run asks for is (an
    optional package of another target may be missing: MissingPackage, from the one asked)."""
    module, _, cls = TARGETS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def target_of(settings: TargetSettings) -> Target:
    """The target --target names, built with its settings."""
    return target_class(settings.target)(settings)


def settings_problem(settings: LoadSettings) -> tuple[str, str] | None:
    """(flag, what is wrong) where the settings do not suit the target, None when they do."""
    name = settings.target.target
    try:
        cls = target_class(name)
    except MissingPackage as exc:
        return "target", str(exc)
    if problem := host_problem(name, settings.sender.host):
        return "host", problem
    for leaf in leaves(TargetSettings):
        if leaf.name in cls.required and not getattr(settings.target, leaf.name):
            return leaf.flag, f"the {name} target needs it"
    for leaf in leaves(TargetSettings):
        path = getattr(settings.target, leaf.name)
        if leaf.name.startswith("tls_") and path and not os.access(path, os.R_OK):
            return leaf.flag, f"cannot read {path}"
    if settings.workload.dataset and not cls.takes_text and not settings.target.tokenizer:
        return "dataset", (f"the {name} target takes token ids only: give --tokenizer to turn "
                           "the dataset's prompts into ids")
    if (settings.traffic.mode == Mode.SESSIONS and settings.workload.dataset
            and not cls.replies_text and not settings.target.tokenizer):
        return "tokenizer", (f"the {name} target streams the replies as token ids: a session "
                             "of the dataset's text turns needs --tokenizer to join them")
    return None


def host_problem(name: str, host: str) -> str | None:
    """What is wrong with --host for this target, None when nothing is."""
    if "://" in host and not target_class(name).over_http:
        return f"the {name} target speaks gRPC: give HOST:PORT, without a scheme, got {host!r}"
    if "://" in host and not host.startswith(("http://", "https://")):
        return f"must be http://HOST:PORT or https://HOST:PORT, got {host!r}"
    return None


def failure_of(exc: BaseException) -> tuple[str, str]:
    """A failure every target shares: its own TargetError, or a fault of the client."""
    if isinstance(exc, TargetError):
        return exc.status, exc.details
    return "CLIENT_ERROR", repr(exc)
