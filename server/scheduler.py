"""Continuous (iteration-level) batching on an engine thread.

Each step: drop cancelled requests (freeing their KV slots), let the policy admit waiting
requests into free slots and batch places, run one engine step that prefills the admitted
and decodes the running, and hand each request its new token through its sink. Sinks are
called on the engine thread; the service makes them thread-safe.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from server.engine import Engine, SeqInput
from server.errors import QueueFullError, UnavailableError
from server.expert_cache import CacheCounters
from server.routing import request_key
from server.telemetry import StepLog, Telemetry
from server.tokenizer import EOS_ID

log = logging.getLogger(__name__)

LENGTH, STOP = "LENGTH", "STOP"
STOP_TIMEOUT_S = 30  # a step that takes longer at shutdown is hung (a stuck device)


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    queue_us: int
    prefill_us: int
    decode_us: int


@dataclass
class TokenEvent:
    token_id: int
    finish_reason: str | None = None  # LENGTH or STOP on the request's last token
    usage: Usage | None = None  # on the last token only


@dataclass
class FailureEvent:
    error: Exception  # a ServerError subclass; ends the request


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    sink: Callable[[TokenEvent | FailureEvent], None]
    ignore_eos: bool = False
    temperature: float = 0.0
    seed: int = 0
    priority: int = 0
    received_ns: int = field(default_factory=time.monotonic_ns)
    output_ids: list[int] = field(default_factory=list)
    slot: int | None = None
    admitted_ns: int = 0
    first_token_ns: int = 0
    prefill_us: int = 0
    done: bool = False
    generator: torch.Generator | None = None


@dataclass
class StatsSnapshot:
    telemetry: Telemetry
    running: int
    waiting: int
    kv_slots_in_use: int
    cache: list[CacheCounters]  # per layer, since the window started; empty without a cache


class Scheduler:
    def __init__(self, engine: Engine, policy, max_batch_size: int, max_queue: int, step_log: StepLog | None = None):
        self.engine = engine
        self.policy = policy
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self._cond = threading.Condition()
        self._waiting: collections.deque[Request] = collections.deque()
        self._running: list[Request] = []
        self._cancelled: list[Request] = []
        self._stopping = False
        self._failure: Exception | None = None
        self._telemetry = Telemetry(engine.args.n_layers, engine.args.n_experts,
                                    cache_baseline=self._live_cache_counters())  # the engine's warm-up excluded
        self.started_ns = time.monotonic_ns()
        self._step_log = step_log
        self.on_failure: Callable[[], None] | None = None  # called on the engine thread if a step raises
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, reason: str) -> None:
        """Stops the engine thread and fails every unfinished request as UNAVAILABLE."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout=STOP_TIMEOUT_S)
        if self._thread.is_alive():
            log.error("engine step still running after %d s; shutting down without it", STOP_TIMEOUT_S)
        self._fail_all(UnavailableError(reason))
        if self._step_log is not None:
            self._step_log.close()

    def submit(self, req: Request) -> None:
        with self._cond:
            if self._stopping or self._failure is not None:
                raise UnavailableError(f"the engine is not running ({self._failure or 'stopping'})")
            if len(self._waiting) >= self.max_queue:
                raise QueueFullError(
                    f"wait queue full ({self.max_queue} requests, --max-queue); "
                    "retry later or send at a lower rate")
            if req.temperature > 0:
                req.generator = self.engine.new_generator(req.seed)
            self._waiting.append(req)
            self._cond.notify()

    def cancel(self, req: Request) -> None:
        """Frees the request's queue place or KV slot before the next step."""
        with self._cond:
            if not req.done:
                self._cancelled.append(req)
                self._cond.notify()

    def count_rejected(self) -> None:
        with self._cond:
            self._telemetry.requests_rejected += 1

    def snapshot(self) -> StatsSnapshot:
        with self._cond:
            telemetry = self._telemetry.snapshot()
            running, waiting = len(self._running), len(self._waiting)
        cache = telemetry.cache_counters(self._live_cache_counters())
        return StatsSnapshot(telemetry, running, waiting, self.engine.kv_slots - self.engine.free_slots, cache)

    def reset_stats(self) -> None:
        with self._cond:
            self._telemetry = Telemetry(self.engine.args.n_layers, self.engine.args.n_experts,
                                        cache_baseline=self._live_cache_counters())

    def _live_cache_counters(self) -> list[CacheCounters]:
        cache = self.engine.cache
        return [CacheCounters(**vars(layer.counters)) for layer in cache.layers] if cache else []

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not (self._waiting or self._running or self._cancelled or self._stopping):
                        self._cond.wait()
                    if self._stopping:
                        return
                    self._reap_cancelled()
                    capacity = min(self.engine.free_slots, self.max_batch_size - len(self._running))
                    admitted = self.policy.select(self._waiting, capacity) if capacity > 0 else []
                    for req in admitted:
                        self._waiting.remove(req)
                    self._telemetry.record_admitted([len(r.prompt_ids) for r in admitted])
                if admitted or self._running:
                    self._step(admitted)
        except Exception as exc:  # the engine is broken: no request may hang on it
            log.exception("engine step failed; failing all requests")
            with self._cond:
                self._failure = exc
            self._fail_all(exc)
            if self.on_failure is not None:
                self.on_failure()

    def _reap_cancelled(self) -> None:
        for req in self._cancelled:
            if req.done:
                continue
            req.done = True
            self._telemetry.requests_aborted += 1
            if req.slot is None:
                self._waiting.remove(req)
            else:
                self._running.remove(req)
                self.engine.free_slot(req.slot)
        self._cancelled.clear()

    def _step(self, admitted: list[Request]) -> None:
        now = time.monotonic_ns()
        seqs = []
        for req in admitted:
            req.slot = self.engine.allocate_slot()
            req.admitted_ns = now
            seqs.append(SeqInput(req.slot, req.prompt_ids, 0, req.temperature, req.generator,
                                 request_key(req.request_id, req.seed)))
        for req in self._running:
            pos = len(req.prompt_ids) + len(req.output_ids) - 1
            seqs.append(SeqInput(req.slot, req.output_ids[-1:], pos, req.temperature, req.generator))
        batch = self._running = admitted + self._running  # running from here, should the step fail

        t0 = time.monotonic_ns()
        result = self.engine.step(seqs)
        t1 = time.monotonic_ns()

        finished = 0
        for req, token in zip(batch, result.next_ids, strict=True):
            req.output_ids.append(token)
            if len(req.output_ids) == 1:
                req.first_token_ns = t1
                req.prefill_us = (t1 - t0) // 1000
            finish = (LENGTH if len(req.output_ids) >= req.max_tokens
                      else STOP if token == EOS_ID and not req.ignore_eos else None)
            if finish:
                req.done = True
                finished += 1
                self.engine.free_slot(req.slot)
                usage = Usage(len(req.prompt_ids), len(req.output_ids),
                              (req.admitted_ns - req.received_ns) // 1000, req.prefill_us,
                              (t1 - req.first_token_ns) // 1000)
                req.sink(TokenEvent(token, finish, usage))
            else:
                req.sink(TokenEvent(token))
        self._running = [r for r in batch if not r.done]

        with self._cond:
            self._telemetry.requests_finished += finished
            self._telemetry.record_step(result, len(batch), (t1 - t0) / 1e6, self.engine.expert_bytes)
            steps = self._telemetry.steps
        if self._step_log is not None:
            self._step_log.write(steps, result, len(batch), len(admitted))

    def _fail_all(self, error: Exception) -> None:
        with self._cond:
            pending = [r for r in (*self._waiting, *self._running) if not r.done]
            self._waiting.clear()
            self._running = []
            self._telemetry.requests_aborted += len(pending)
        for req in pending:
            req.done = True
            if req.slot is not None:
                self.engine.free_slot(req.slot)
            req.sink(FailureEvent(error))
