"""Admission, what the server's two front ends share (gRPC, server/frontends/grpc_service.py;
OpenAI-compatible HTTP, server/frontends/http_api.py): a request in neither's terms
(`GenerationRequest`), its validation against the model's limits, its submission to the engine
thread as a `Request` (server/scheduling/requests.py), and the stream of its tokens as they
come.

Both front ends therefore accept and refuse the same requests with the same messages, and a
request counts the same in the telemetry whichever door it came in by.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from server.engine.tokenizer import Tokenizer
from server.errors import InvalidRequestError, QueueFullError, ServerError, UnavailableError
from server.scheduling.engine_thread import EngineThread
from server.scheduling.faults import Fate
from server.scheduling.requests import FailureEvent, FinishReason, Request, TokenEvent, Usage


@dataclass(frozen=True)
class RequestLimits:
    """What a request may ask of this server: the model's vocabulary and context,
    --max-tokens-limit and --max-streams-per-client."""

    vocab_size: int
    max_seq_len: int
    max_tokens_limit: int
    max_streams_per_client: int = 0  # 0: no quota


@dataclass(frozen=True, kw_only=True)
class GenerationRequest:
    """One generation request, whichever protocol it came in."""

    request_id: str = ""  # a fresh id when empty
    prompt: str = ""  # UTF-8 text, tokenized here ...
    prompt_ids: tuple[int, ...] = ()  # ... or token ids: exactly one of the two
    max_tokens: int
    ignore_eos: bool = False
    min_tokens: int = 0  # end-of-sequence before this many output tokens is ignored
    temperature: float = 0.0
    seed: int = 0
    priority: int = 0


@dataclass(frozen=True)
class Batch:
    """The tokens that arrived since the last message (several, for a slow reader)."""

    ids: list[int]
    text: str  # their text, UTF-8 sequences split across batches held back until complete
    finish_reason: FinishReason | None = None  # on the last batch
    usage: Usage | None = None  # on the last batch
    error: Exception | None = None  # the request failed: a ServerError, or the engine's own


def prompt_ids_of(ask: GenerationRequest, limits: RequestLimits, tokenizer: Tokenizer) -> list[int]:
    """The request's prompt as token ids, or InvalidRequestError saying what to change. A
    prompt too long for the context is refused before any work on it where the tokenizer can
    tell (the byte-level one: every character is at least one token)."""
    if ask.prompt and ask.prompt_ids:
        raise InvalidRequestError("set either prompt or prompt_token_ids, not both")
    at_least = len(ask.prompt_ids) or tokenizer.fewest_tokens(ask.prompt)
    if at_least >= limits.max_seq_len:
        raise InvalidRequestError(
            f"prompt is at least {at_least} tokens but the model context is "
            f"{limits.max_seq_len} tokens; shorten the prompt to at most "
            f"{limits.max_seq_len - 1} tokens")
    if ask.prompt_ids:
        bad = next((i for i in ask.prompt_ids if not 0 <= i < limits.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                f"prompt_token_ids contains {bad}, outside the vocabulary "
                f"0..{limits.vocab_size - 1}")
        return list(ask.prompt_ids)
    if not ask.prompt:
        raise InvalidRequestError("prompt is empty: set prompt (text) or prompt_token_ids")
    ids = tokenizer.encode(ask.prompt)
    if not ids:
        raise InvalidRequestError("the prompt is no tokens at all to this model's tokenizer")
    return ids


def validate(ask: GenerationRequest, prompt_len: int, limits: RequestLimits) -> None:
    ctx = limits.max_seq_len
    if ask.max_tokens < 1:
        raise InvalidRequestError("max_tokens must be at least 1")
    if ask.max_tokens > limits.max_tokens_limit:
        raise InvalidRequestError(
            f"max_tokens {ask.max_tokens} is above this server's limit of "
            f"{limits.max_tokens_limit} (--max-tokens-limit); "
            f"ask for at most {limits.max_tokens_limit}")
    if prompt_len >= ctx:
        raise InvalidRequestError(
            f"prompt is {prompt_len} tokens but the model context is {ctx} tokens; "
            f"shorten the prompt to at most {ctx - 1} tokens")
    if prompt_len + ask.max_tokens > ctx:
        raise InvalidRequestError(
            f"prompt ({prompt_len} tokens) + max_tokens ({ask.max_tokens}) exceeds the model "
            f"context of {ctx} tokens; set max_tokens to at most {ctx - prompt_len}")
    if not math.isfinite(ask.temperature) or ask.temperature < 0:
        raise InvalidRequestError(
            f"temperature must be a finite number >= 0 (0 = greedy), got {ask.temperature}")
    if ask.min_tokens < 0:
        raise InvalidRequestError(f"min_tokens must be at least 0, got {ask.min_tokens}")


class Stream:
    """One submitted request's tokens. Use it as `async with stream:` straight after submitting
    and read `batches()` inside: leaving early (a client gone, a deadline) cancels the request,
    freeing its KV slot before the next engine step."""

    def __init__(self, admission: Admission, request: Request, events: asyncio.Queue,
                 fate: Fate):
        self.admission, self.request, self.events = admission, request, events
        self.fate = fate  # injected faults (server/scheduling/faults.py)
        self.finished = False  # the engine is done with it: every batch is in the queue
        self.closed = False

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(self, *_) -> None:
        if not self.finished:
            self.admission.engine_thread.cancel(self.request)
        if not self.closed:
            self.closed = True
            self.admission.closed(self.request.client)

    async def batches(self) -> AsyncIterator[Batch]:
        decoder = self.admission.tokenizer.decoder()
        while not self.finished:
            events = [await self.events.get()]
            while not self.events.empty():  # a slow reader gets several tokens a message
                events.append(self.events.get_nowait())
            failure = next((e for e in events if isinstance(e, FailureEvent)), None)
            if failure is not None:
                self.finished = True
                yield Batch([], "", error=failure.error)
                return
            tokens: list[TokenEvent] = events
            ids = [e.token_id for e in tokens]
            text = decoder.decode(ids)
            last = tokens[-1]
            if last.finish_reason:
                self.finished = True
                text += decoder.flush()
            if self.fate.slow_s:
                await asyncio.sleep(self.fate.slow_s)
            yield Batch(ids, text, last.finish_reason, last.usage)
            if self.fate.drop and not self.finished:
                yield Batch([], "", error=self.admission.engine_thread.faults.dropped())
                return


class Admission:
    """Admission for both front ends: checks a request, submits it, hands back its stream."""

    def __init__(self, engine_thread: EngineThread, limits: RequestLimits):
        self.engine_thread = engine_thread
        self.limits = limits
        self.tokenizer = engine_thread.engine.tokenizer
        self.draining = False  # set on SIGTERM: new requests are refused as UNAVAILABLE
        self.open = 0  # streams submitted and not yet closed
        self.open_by_client: collections.Counter[str] = collections.Counter()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def serving(self) -> bool:
        return not self.draining and self.engine_thread.running

    def closed(self, client: str) -> None:
        """A stream's reader is done with it."""
        self.open -= 1
        self.open_by_client[client] -= 1
        if not self.open_by_client[client]:
            del self.open_by_client[client]
        if not self.open:
            self._idle.set()

    async def idle(self, timeout_s: float) -> None:
        """Until no stream is open, or timeout_s."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            pass

    def check_quota(self, client: str) -> None:
        quota = self.limits.max_streams_per_client
        if quota and self.open_by_client[client] >= quota:
            error = QueueFullError(f"this client already has {quota} open requests, this "
                                   f"server's quota per client (--max-streams-per-client); "
                                   f"wait for one to finish")
            error.retry_after_s = self.engine_thread.retry_after_s()
            raise error

    def admit(self, ask: GenerationRequest, received_ns: int | None = None,
              client: str = "") -> Stream:
        """The request's stream; a request that cannot be served raises ServerError (and
        counts as rejected). client: who sent it, for the quota and fair admission."""
        received_ns = received_ns or time.monotonic_ns()
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def sink(event):  # called on the engine thread
            loop.call_soon_threadsafe(events.put_nowait, event)

        try:
            if self.draining:
                raise UnavailableError("server is shutting down; "
                                       "send the request to another replica")
            self.check_quota(client)
            prompt_ids = prompt_ids_of(ask, self.limits, self.tokenizer)
            validate(ask, len(prompt_ids), self.limits)
            request = Request(request_id=ask.request_id or uuid.uuid4().hex,
                              prompt_ids=prompt_ids, max_tokens=ask.max_tokens, sink=sink,
                              ignore_eos=ask.ignore_eos, min_tokens=ask.min_tokens,
                              temperature=ask.temperature, seed=ask.seed, priority=ask.priority,
                              client=client, received_ns=received_ns)
            self.engine_thread.submit(request)
        except ServerError:
            self.engine_thread.count_rejected()
            raise
        self.open += 1
        self.open_by_client[client] += 1
        self._idle.clear()
        return Stream(self, request, events, self.engine_thread.faults.fate())
