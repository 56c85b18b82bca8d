"""Batching policies: each step, which requests run and how much of each prompt
is prefilled.

All policies sit on one continuous-batching loop (server/scheduling/batching_loop.py). A
policy sees a `View`: the time, the wait queue (arrival order), the resident requests (holding
a KV slot: prefilling or decoding, in admission order) and the free KV slots. It returns a
`StepPlan`: prompt chunks to prefill (a waiting request in it gets a KV slot) and resident
requests to decode, or nothing and when to ask again. Policies never preempt: a full KV
pool makes admission wait. The batching loop then cuts the plan's prompt chunks to
--max-prefill-tokens, so every policy resumes a prompt a step before left part-prefilled.
The engine and the service never ask which policy runs.

A policy is a frozen dataclass whose fields are its knobs, named as the batching settings
that set them (records/server_settings/), and one entry in POLICIES.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar, Protocol

import torch

from records.declare import require
from records.server_settings import Batching


class Pending(Protocol):
    """What a policy reads of a request (server/scheduling/requests.py)."""

    request_id: str
    received_ns: int
    priority: int
    prompt_len: int
    prompt_left: int  # prompt tokens not yet in the KV cache; 0 once decoding
    last_run_ns: int  # end of the last step that ran it (its arrival before the first)
    # [L, E] bool: the experts its last step used; None before its prefill
    signature: torch.Tensor | None


class Policy(Protocol):
    name: ClassVar[str]
    max_batch_size: int  # requests a step runs at most

    def plan(self, v: View) -> StepPlan: ...


@dataclass
class StepPlan:
    # (request, prompt tokens this step)
    prefill: list[tuple[Pending, int]] = field(default_factory=list)
    decode: list[Pending] = field(default_factory=list)
    wake_in_s: float | None = None  # with an empty plan: ask again after this long, or on new work

    def __bool__(self) -> bool:
        return bool(self.prefill or self.decode)


@dataclass(frozen=True)
class View:
    now_ns: int
    waiting: Sequence[Pending]  # not yet admitted, oldest first
    resident: Sequence[Pending]  # hold a KV slot, in admission order
    free_slots: int
    # the prompt tokens a waiting request would find in the prefix cache now (0 without one)
    cached: Callable[[Pending], int] = lambda req: 0


def age_ms(req: Pending, now_ns: int) -> float:
    return (now_ns - req.received_ns) / 1e6


def decoding(resident: Sequence[Pending]) -> list[Pending]:
    return [r for r in resident if r.prompt_left == 0]


def resuming(resident: Sequence[Pending]) -> list[tuple[Pending, int]]:
    """The rest of each prompt a step before prefilled in part, as chunks."""
    return [(r, r.prompt_left) for r in resident if r.prompt_left]


def within_prefill_budget(prefill: list[tuple[Pending, int]],
                          budget: int) -> list[tuple[Pending, int]]:
    """A plan's prompt chunks, in its order, cut to budget tokens in all (--max-prefill-tokens,
    under every policy): the chunk that crosses it is shortened and its request prefills the
    rest next step; those after it wait."""
    kept = []
    for req, n in prefill:
        if budget <= 0:
            break
        kept.append((req, min(n, budget)))
        budget -= n
    return kept


@dataclass(frozen=True)
class Fcfs:
    """Continuous batching in arrival order: every step decodes the resident requests and
    admits waiting ones, whole prompts, while KV slots and batch places allow."""

    name: ClassVar[str] = "fcfs"
    max_batch_size: int

    def plan(self, v: View) -> StepPlan:
        plan = StepPlan(decode=decoding(v.resident)[:self.max_batch_size])
        room = self.max_batch_size - len(plan.decode)
        plan.prefill = resuming(v.resident)[:room]
        room -= len(plan.prefill)
        plan.prefill += [(r, r.prompt_left)
                         for r in list(v.waiting)[:max(0, min(room, v.free_slots))]]
        return plan


@dataclass(frozen=True)
class Static:
    """Pre-Orca static batching: gather up to max_batch_size requests or wait max_wait_ms,
    prefill them together, decode until every one of them finishes; arrivals wait for the
    next batch."""

    name: ClassVar[str] = "static"
    max_batch_size: int
    max_wait_ms: float

    def plan(self, v: View) -> StepPlan:
        if v.resident:  # the batch's prompts cut by --max-prefill-tokens go on first
            return StepPlan(prefill=resuming(v.resident), decode=decoding(v.resident))
        size = min(self.max_batch_size, v.free_slots)
        if not v.waiting or size == 0:
            return StepPlan()
        wait_left_ms = self.max_wait_ms - age_ms(v.waiting[0], v.now_ns)
        if len(v.waiting) < size and wait_left_ms > 0:
            return StepPlan(wake_in_s=wait_left_ms / 1e3)
        return StepPlan(prefill=[(r, r.prompt_left) for r in list(v.waiting)[:size]])


def length_bucket(tokens: int) -> int:
    """Prompt-length bucket: powers of two, so a bucket's prompts differ by at most 2x."""
    return math.ceil(math.log2(max(tokens, 1)))


@dataclass(frozen=True)
class Dynamic:
    """Continuous batching whose admissions merge requests of similar prompt length: waiting
    requests are grouped into power-of-two length buckets, and the oldest request's bucket
    is admitted together once it fills the free batch places or its oldest member has
    waited max_wait_ms. Less padding in the batched prefill."""

    name: ClassVar[str] = "dynamic"
    max_batch_size: int
    max_wait_ms: float

    def plan(self, v: View) -> StepPlan:
        plan = StepPlan(decode=decoding(v.resident)[:self.max_batch_size])
        plan.prefill = resuming(v.resident)[:self.max_batch_size - len(plan.decode)]
        room = min(self.max_batch_size - len(plan.decode) - len(plan.prefill), v.free_slots)
        if not v.waiting or room <= 0:
            return plan
        buckets: dict[int, list] = {}
        for r in v.waiting:
            buckets.setdefault(length_bucket(r.prompt_len), []).append(r)
        # The oldest request's bucket once it has waited long enough (the age bound comes
        # first), else any bucket full enough to fill the free places.
        oldest = buckets[length_bucket(v.waiting[0].prompt_len)]
        wait_left_ms = self.max_wait_ms - age_ms(oldest[0], v.now_ns)
        ready = (oldest if wait_left_ms <= 0
                 else next((b for b in buckets.values() if len(b) >= room), None))
        if ready is None:
            plan.wake_in_s = wait_left_ms / 1e3
            return plan
        plan.prefill += [(r, r.prompt_left) for r in ready[:room]]
        return plan


@dataclass(frozen=True)
class ExpertAware:
    """When more requests hold KV slots than a step runs (--kv-slots above --max-batch-size),
    decode the set that activates the fewest distinct experts: greedy, starting from the
    oldest, each time adding the request whose expert signature (the experts its last step
    used, per layer) adds the fewest experts not yet active. A request that has not run for
    max_wait_ms goes first, so nobody starves.

    New requests have no signature until prefilled. They are admitted into free batch places
    as in fcfs, and also, a quarter of a batch at a time, once the oldest has waited
    max_wait_ms although every place could decode: that is how the KV pool comes to hold
    more requests than a step runs. Otherwise steps decode only, since a prompt's many
    tokens activate nearly every expert and would undo the grouping."""

    name: ClassVar[str] = "expert_aware"
    max_batch_size: int
    max_wait_ms: float

    def plan(self, v: View) -> StepPlan:
        size = self.max_batch_size
        ready = decoding(v.resident)
        prefilling = ([r for r in v.resident if r.prompt_left]
                      + list(v.waiting)[:max(0, v.free_slots)])
        n_prefill = 0
        if prefilling and len(ready) < size:
            n_prefill = min(len(prefilling), size - len(ready))
        elif prefilling and age_ms(prefilling[0], v.now_ns) >= self.max_wait_ms:
            n_prefill = min(len(prefilling), max(1, size // 4))
        plan = StepPlan(prefill=[(r, r.prompt_left) for r in prefilling[:n_prefill]])
        places = size - n_prefill
        if len(ready) <= places:
            plan.decode = ready
            return plan
        overdue = [r for r in ready
                   if (v.now_ns - r.last_run_ns) / 1e6 >= self.max_wait_ms][:places]
        rest = [r for r in ready if r not in overdue]
        plan.decode = overdue + self.fewest_experts(rest, places - len(overdue), overdue)
        return plan

    @staticmethod
    def fewest_experts(candidates: list[Pending], n: int, chosen: list[Pending]) -> list[Pending]:
        """Greedy: oldest first when nothing is chosen yet, then the smallest new-expert count
        (ties to the older request)."""
        if n <= 0 or not candidates:
            return []
        # [R, L*E], admission = age order
        signatures = torch.stack([r.signature for r in candidates]).flatten(1)
        active = torch.stack([r.signature for r in chosen]).flatten(1).any(0) if chosen else None
        taken = torch.zeros(len(candidates), dtype=torch.bool, device=signatures.device)
        picked = []
        for _ in range(min(n, len(candidates))):
            if active is None:
                i = 0
            else:
                # argmin returns the first minimum: ties go to the older request.
                new = (signatures & ~active).sum(1).masked_fill(taken, signatures.shape[1] + 1)
                i = int(new.argmin())
            taken[i] = True
            picked.append(candidates[i])
            active = signatures[i].clone() if active is None else active | signatures[i]
        return picked


@dataclass(frozen=True)
class LatencySensitive:
    """Caps the batch and the tokens of each step (max_step_tokens): running decodes always
    go first, one token each; the rest of the budget prefills prompts in chunks (Sarathi
    style), so a long prompt never stalls running decodes; higher priority is admitted first,
    then arrival order."""

    name: ClassVar[str] = "latency_sensitive"
    max_batch_size: int
    max_step_tokens: int

    def __post_init__(self):
        require(self.max_step_tokens >= self.max_batch_size, "max-step-tokens",
                f"must be at least --max-batch-size ({self.max_batch_size}) so every running "
                f"decode fits, got {self.max_step_tokens}")

    def plan(self, v: View) -> StepPlan:
        size, budget = self.max_batch_size, self.max_step_tokens
        plan = StepPlan(decode=decoding(v.resident)[:min(size, budget)])
        budget -= len(plan.decode)
        room = size - len(plan.decode)
        # stable: arrival order
        waiting = sorted(v.waiting, key=lambda r: -r.priority)[:max(0, v.free_slots)]
        for r in [r for r in v.resident if r.prompt_left] + waiting:
            if budget <= 0 or room <= 0:
                break
            chunk = min(r.prompt_left, budget)
            plan.prefill.append((r, chunk))
            budget -= chunk
            room -= 1
        return plan


@dataclass(frozen=True)
class PrefixAware:
    """Continuous batching that admits first the waiting requests with the longest cached
    prompt prefix (the prefix cache, on by default), in the spirit of SGLang's
    longest-prefix-match scheduling: they prefill least, and run while the prefix they share
    is still cached. A request that has waited max_wait_ms is admitted first, in arrival
    order, so none starves. Decodes and resumed prompts go as in fcfs."""

    name: ClassVar[str] = "prefix_aware"
    max_batch_size: int
    max_wait_ms: float

    def plan(self, v: View) -> StepPlan:
        plan = StepPlan(decode=decoding(v.resident)[:self.max_batch_size])
        room = self.max_batch_size - len(plan.decode)
        plan.prefill = resuming(v.resident)[:room]
        room = min(room - len(plan.prefill), v.free_slots)
        if room <= 0 or not v.waiting:
            return plan
        overdue = [r for r in v.waiting if age_ms(r, v.now_ns) >= self.max_wait_ms]
        # stable: equal prefixes in arrival order
        rest = sorted((r for r in v.waiting if age_ms(r, v.now_ns) < self.max_wait_ms),
                      key=lambda r: -v.cached(r))
        plan.prefill += [(r, r.prompt_left) for r in (overdue + rest)[:room]]
        return plan


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (Fcfs, Static, Dynamic, ExpertAware,
                                                         LatencySensitive, PrefixAware)}


def build_policy(batching: Batching) -> Policy:
    """The policy --policy names, its knobs taken from the batching settings of the same name."""
    kind = POLICIES[batching.policy]
    return kind(**{f.name: getattr(batching, f.name) for f in fields(kind)})


def knobs(policy: Policy) -> dict[str, float]:
    """The policy's settings, as GetStats reports them."""
    return {name: float(value) for name, value in asdict(policy).items()}
