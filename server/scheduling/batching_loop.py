"""The continuous-batching loop, one step at a time, without threads: plan (the policy),
run (the engine), apply (tokens to requests). The engine thread
(server/scheduling/engine_thread.py) runs it; tests drive it directly with a fake clock and a
fake engine.

`plan` and `apply` change shared state and run under the engine thread's lock; `run` only
touches the engine and runs outside it, so submits, cancels and stats never wait for a
step.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from records.engine_telemetry import Count
from server.engine.expert_cache import CacheCounters
from server.engine.interface import Engine, SeqInput, StepResult
from server.engine.routers import request_key
from server.errors import QueueFullError
from server.scheduling.fairness import fair_order
from server.scheduling.faults import Injector
from server.scheduling.policies import Policy, StepPlan, View, within_prefill_budget
from server.scheduling.prefix_cache import PrefixCache, block_keys
from server.scheduling.requests import FailureEvent, FinishReason, Request, TokenEvent, Usage
from server.telemetry.histogram import count_bounds
from server.telemetry.step_log import StepLog
from server.telemetry.window import Telemetry

LIFETIME_PRIOR_S = 1.0  # a request's lifetime before any has finished
LIFETIME_WEIGHT = 0.1  # of each finished request in the moving average (the last ~10 count)
MIN_RETRY_S = 0.05


@dataclass(frozen=True)
class LoopOptions:
    """What a batching loop works with beside its engine and policy."""

    max_queue: int  # waiting requests before the next is refused
    max_prefill_tokens: int | None = None  # prompt tokens per step under any policy; None: no cap
    # where new requests reuse cached prompt prefixes; None: they never do
    prefix_cache: PrefixCache | None = None
    faults: Injector | None = None  # the fault rehearsal, before each step
    step_log: StepLog | None = None  # a line per step
    clock: Callable[[], int] = time.monotonic_ns


class BatchingLoop:
    def __init__(self, engine: Engine, policy: Policy, options: LoopOptions):
        self.engine = engine
        self.policy = policy
        self.prefix_cache = options.prefix_cache
        self.faults = options.faults
        self.max_prefill_tokens = options.max_prefill_tokens
        self.max_queue = options.max_queue
        self.clock = options.clock
        self.step_log = options.step_log
        self.waiting: collections.deque[Request] = collections.deque()
        self.resident: list[Request] = []  # hold a KV slot, in admission order
        self.cancelled: list[Request] = []
        self.telemetry = self.new_telemetry()  # the engine's warm-up excluded
        self.lifetime_s = LIFETIME_PRIOR_S  # moving average: received -> finished

    def new_telemetry(self) -> Telemetry:
        return Telemetry(self.engine.args.n_layers, self.engine.args.n_experts,
                         {"batch_size": count_bounds(self.policy.max_batch_size)},
                         cache_baseline=self.cache_counters(), ranks=self.engine.world)

    def cache_counters(self) -> list[CacheCounters]:
        return [dataclasses.replace(cache.counters) for cache in self.engine.caches]

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.resident or self.cancelled)

    def enqueue(self, req: Request) -> None:
        if len(self.waiting) >= self.max_queue:
            raise QueueFullError(f"wait queue full ({self.max_queue} requests, --max-queue); "
                                 "retry later or send at a lower rate")
        req.last_run_ns = req.received_ns
        self.waiting.append(req)

    def retry_after_s(self) -> float:
        """When a place is likely to free: a request's mean lifetime over the requests holding
        places, as each is about as far along as any other."""
        return max(MIN_RETRY_S, self.lifetime_s / max(1, len(self.resident)))

    def cancel(self, req: Request) -> None:
        if not req.done:
            self.cancelled.append(req)

    def plan(self) -> StepPlan:
        """Frees cancelled requests, asks the policy, gives newly admitted requests a slot."""
        self._reap_cancelled()
        now = self.clock()
        plan = self.policy.plan(View(now, fair_order(self.waiting, self.resident),
                                     self.resident, len(self.engine.slots), self.cached))
        if self.max_prefill_tokens is not None:
            plan.prefill = within_prefill_budget(plan.prefill, self.max_prefill_tokens)
        admitted = []
        for req, _ in plan.prefill:
            if req.slot is None:
                self._take_slot(req)
                req.admitted_ns = now
                self.waiting.remove(req)
                self.resident.append(req)
                admitted.append(len(req.prompt_ids))
        self.telemetry.record_admitted(admitted)
        # a cached prefix shortened the prompt left
        plan.prefill = [(req, min(n, req.prompt_left)) for req, n in plan.prefill]
        if self.holds_back(plan):
            self.telemetry.counts[Count.PLANS_HELD_BACK] += 1
        return plan

    def holds_back(self, plan: StepPlan) -> bool:
        """Whether the plan leaves work out: a request still waiting, a resident one it does not
        run, or a prompt it cuts short. A policy only chooses where some plan holds back."""
        if self.waiting or any(n < req.prompt_left for req, n in plan.prefill):
            return True
        planned = len(plan.prefill) + len(plan.decode)
        return planned < len(self.resident)

    def _take_slot(self, req: Request) -> None:
        """A KV slot for a new request: where the prefix cache places it (its cached prefix
        then counts as prefilled), or the pool's next."""
        cache, counts = self.prefix_cache, self.telemetry.counts
        counts[Count.PREFIX_CACHE_QUERIES] += req.prompt_len  # without a cache: none of it hits
        if cache is None:
            req.slot = self.engine.slots.take()
            return
        placement, evicted = cache.place(self.keys_of(req), req.prompt_len)
        req.slot, req.prefilled = placement.slot, placement.cached
        req.prefix_from = placement.source
        counts[Count.PREFIX_CACHE_HITS] += placement.cached
        counts[Count.PREFIX_CACHE_COPIED] += placement.cached * (placement.source != placement.slot)
        counts[Count.PREFIX_CACHE_EVICTIONS] += evicted

    def cached(self, req: Request) -> int:
        """The prompt tokens a waiting request would find in the prefix cache now."""
        if self.prefix_cache is None:
            return 0
        return self.prefix_cache.cached(self.keys_of(req), req.prompt_len)

    def keys_of(self, req: Request) -> list[int]:
        if req.block_keys is None:
            req.block_keys = block_keys(req.prompt_ids, self.prefix_cache.block)
        return req.block_keys

    def _give_slot(self, req: Request) -> None:
        """The request's slot back to the pool; its KV stays there for the prefix cache (its
        blocks computed: the prompt once prefilled, and the output but its last token)."""
        cache = self.prefix_cache
        if cache is not None and not req.prompt_left:
            cache.computed(req.slot, block_keys(req.prompt_ids + req.output_ids[:-1],
                                                cache.block, self.keys_of(req)))
        self.engine.slots.give(req.slot)
        if cache is not None:
            self.telemetry.counts[Count.PREFIX_CACHE_EVICTIONS] += cache.freed()

    def run(self, plan: StepPlan) -> tuple[StepResult, int, int]:
        """One engine step for the plan; returns the result and its start and end times."""
        seqs = [SeqInput(req.slot, req.prompt_ids[req.prefilled:req.prefilled + n], req.prefilled,
                         temperature=req.temperature, seed=req.seed,
                         routing_key=request_key(req.request_id, req.seed),
                         prefix_from=req.prefix_from)
                for req, n in plan.prefill]
        for req, _ in plan.prefill:
            req.prefix_from = None  # taken in by this step
        seqs += [SeqInput(req.slot, req.output_ids[-1:],
                          len(req.prompt_ids) + len(req.output_ids) - 1,
                          temperature=req.temperature, seed=req.seed)
                 for req in plan.decode]
        if self.faults is not None:
            self.faults.before_step()
        t0 = self.clock()
        result = self.engine.step(seqs)
        return result, t0, self.clock()

    def apply(self, plan: StepPlan, result: StepResult, t0: int, t1: int) -> None:
        """Hands out the step's tokens, finishes requests, records telemetry, then delivers:
        a client that saw its last token finds it counted in GetStats."""
        deliveries = []
        finished = 0
        ran = [(req, n) for req, n in plan.prefill] + [(req, 0) for req in plan.decode]
        if result.token_experts is not None:
            keep_routing(ran, result.token_experts)
        for i, ((req, chunk), token) in enumerate(zip(ran, result.next_ids, strict=True)):
            req.last_run_ns = t1
            req.signature = result.seq_experts[i]
            if req.done:  # cancelled while the step ran; reaped before the next one
                continue
            if chunk:
                req.prefilled += chunk
                req.prefill_us += (t1 - t0) // 1000
                if req.prompt_left:
                    continue  # a prompt chunk: its logits are not a token yet
                req.first_token_ns = t1
                if self.prefix_cache is not None:  # its prompt can serve others now
                    self.prefix_cache.computed(req.slot, self.keys_of(req))
            req.output_ids.append(token)
            stops = (token in self.engine.tokenizer.eos_ids and not req.ignore_eos
                     and len(req.output_ids) > req.min_tokens)
            finish = (FinishReason.LENGTH if len(req.output_ids) >= req.max_tokens
                      else FinishReason.STOP if stops else None)
            usage = self._finish(req, t1) if finish else None
            finished += usage is not None
            deliveries.append((req.sink, TokenEvent(token, finish, usage)))
        self.resident = [r for r in self.resident if not r.done]
        self.telemetry.counts[Count.REQUESTS_FINISHED] += finished
        self.telemetry.record_step(result, len(ran), len(deliveries), (t1 - t0) / 1e6,
                                   self.engine.expert_bytes)
        if self.step_log is not None:
            self.step_log.write(self.telemetry.counts[Count.STEPS], result, len(ran),
                                len(plan.prefill))
        for sink, event in deliveries:
            sink(event)

    def _finish(self, req: Request, t1: int) -> Usage:
        """A request whose last token the step at t1 made: its slot freed, its lifetime and
        latencies recorded; what it used."""
        req.done = True
        lifetime_s = (t1 - req.received_ns) / 1e9
        self.lifetime_s += LIFETIME_WEIGHT * (lifetime_s - self.lifetime_s)
        self._give_slot(req)
        usage = Usage(prompt_tokens=len(req.prompt_ids), completion_tokens=len(req.output_ids),
                      queue_us=(req.admitted_ns - req.received_ns) // 1000,
                      prefill_us=req.prefill_us, decode_us=(t1 - req.first_token_ns) // 1000,
                      routed_experts=routing_of(req) if req.prompt_routing else None)
        n = len(req.output_ids)
        self.telemetry.record_request(usage.queue_us / 1000, usage.prefill_us / 1000,
                                      (req.first_token_ns - req.received_ns) / 1e6,
                                      usage.decode_us / 1000 / (n - 1) if n > 1 else None)
        return usage

    def _reap_cancelled(self) -> None:
        for req in self.cancelled:
            if req.done:
                continue
            req.done = True
            self.telemetry.counts[Count.REQUESTS_ABORTED] += 1
            if req.slot is None:
                self.waiting.remove(req)
            else:
                self.resident.remove(req)
                self._give_slot(req)
        self.cancelled.clear()

    def fail_all(self, error: Exception) -> None:
        """Ends every unfinished request with error and frees its slot."""
        self._fail([r for r in (*self.waiting, *self.resident) if not r.done], error)

    def fail_plan(self, plan: StepPlan, error: Exception) -> None:
        """Ends the requests of a step that failed (an injected fault); the rest go on."""
        self._fail([r for r in [req for req, _ in plan.prefill] + plan.decode if not r.done],
                   error)

    def _fail(self, pending: list[Request], error: Exception) -> None:
        failing = set(map(id, pending))
        self.waiting = collections.deque(r for r in self.waiting if id(r) not in failing)
        self.resident = [r for r in self.resident if id(r) not in failing]
        self.telemetry.counts[Count.REQUESTS_ABORTED] += len(pending)
        for req in pending:
            req.done = True
            if req.slot is not None:
                self._give_slot(req)
            req.sink(FailureEvent(error))


def keep_routing(ran: list, token_experts: torch.Tensor) -> None:
    """Each request's share of the step's token experts [N, L, k] (its tokens in turn: a
    prompt chunk's, or a decode step's one)."""
    at = 0
    for req, chunk in ran:
        n = chunk or 1
        (req.prompt_routing if chunk else req.output_routing).append(token_experts[at:at + n])
        at += n
    if at != len(token_experts):  # the engine's tokens are not the plan's: never hand them out
        raise RuntimeError(f"the step's expert ids cover {len(token_experts)} tokens, its "
                           f"plan {at}")


def routing_of(req: Request) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt, output) expert ids; prompt tokens the prefix cache held, never computed here,
    are -1 rows at the front."""
    computed = torch.cat(req.prompt_routing)
    cached = torch.full((req.prompt_len - len(computed), *computed.shape[1:]), -1,
                        dtype=computed.dtype)
    output = (torch.cat(req.output_routing) if req.output_routing
              else computed.new_empty((0, *computed.shape[1:])))
    return torch.cat([cached, computed]), output
