"""Batching policy invariants, driving the real batching loop with a deterministic fake clock
and a fake engine whose step time grows with tokens and with distinct experts: static never
admits mid-batch, fcfs keeps arrival order, dynamic's buckets respect the wait bound,
expert_aware activates fewer experts than fcfs under affinity and still serves everyone
within its age bound, latency_sensitive keeps the token budget and never skips a running
decode, every request finishes exactly once under every policy, and none prefills more than
--max-prefill-tokens in a step; plus each policy on a real server streaming exact token
counts; and that a plan leaving work out is counted, the only case in which the policies can
differ."""

import collections
import random
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from proto import moe_pb2
from records.server_settings import Batching
from server.engine.interface import StepResult
from server.engine.routers import request_key
from server.engine.slots import SlotPool
from server.engine.stages import STAGES
from server.engine.tokenizer import ByteTokenizer
from server.scheduling.batching_loop import BatchingLoop, LoopOptions
from server.scheduling.policies import POLICIES, build_policy, length_bucket
from server.scheduling.prefix_cache import PrefixCache
from server.scheduling.requests import Request, TokenEvent
from tests.conftest import running_server

MS = 1_000_000
N_LAYERS, N_EXPERTS = 2, 8


class FakeClock:
    def __init__(self):
        self.now_ns = 0

    def __call__(self) -> int:
        return self.now_ns


class FakeEngine:
    """Each request routes to two experts fixed by its routing key (strong affinity); a step
    costs 0.05 ms per token plus 1 ms per distinct expert per layer."""

    args = SimpleNamespace(n_layers=N_LAYERS, n_experts=N_EXPERTS, top_k=2)
    tokenizer = ByteTokenizer()
    device = torch.device("cpu")
    seed = 0
    kernel_name = "fake"
    world = 1
    expert_bytes = 1

    def __init__(self, clock: FakeClock, kv_slots: int):
        self.clock = clock
        self.kv_slots = kv_slots
        self.slots = SlotPool(range(kv_slots))  # refuses a slot freed twice
        self.caches = []
        self.key_of: dict[int, int] = {}
        self.active_per_step: list[int] = []

    def stop(self) -> None:
        """Nothing runs beside it."""

    def step(self, seqs) -> StepResult:
        used = torch.zeros(len(seqs), N_LAYERS, N_EXPERTS, dtype=torch.bool)
        for i, s in enumerate(seqs):
            if s.begins:
                self.key_of[s.slot] = s.routing_key
            key = self.key_of[s.slot]
            used[i, :, [key % N_EXPERTS, (key // N_EXPERTS) % N_EXPERTS]] = True
        active = used.any(dim=0).sum(dim=1).tolist()
        tokens = sum(len(s.token_ids) for s in seqs)
        self.active_per_step.append(sum(active))
        self.clock.now_ns += 50_000 * tokens + MS * sum(active)
        routed = used.sum(dim=0).long()
        return StepResult(next_ids=[7] * len(seqs), routed=routed, dropped=None, active=active,
                          seq_experts=used, stage_ms=dict.fromkeys(STAGES, 0.0), tokens=tokens,
                          kv_useful=0, kv_computed=0, prefill_tokens=0, prefill_padded=0)


@dataclass
class Run:
    engine: FakeEngine
    requests: list[Request]
    events: dict[str, list] = field(default_factory=dict)
    # (resident before the plan, ids decoding then, plan, time)
    views: list = field(default_factory=list)
    held_back: int = 0  # the loop's plans that left work out


class Recording:
    """Wraps a policy to keep what it saw and what it planned."""

    def __init__(self, policy, run: Run):
        self.policy, self.run = policy, run
        self.max_batch_size = policy.max_batch_size

    def plan(self, v):
        plan = self.policy.plan(v)
        # state now, not at the end
        decoding = {r.request_id for r in v.resident if r.prompt_left == 0}
        self.run.views.append((list(v.resident), decoding, plan, v.now_ns))
        return plan


def simulate(policy_name: str, arrivals, kv_slots=8, max_batch_size=4,
             max_prefill_tokens: int | None = None, prompt_of=None, cache_block: int = 0,
             **knobs) -> Run:
    """arrivals: (time ms, prompt tokens, max tokens, priority) per request; prompt_of(i, n):
    request i's prompt of n tokens (default n ones); cache_block: the prefix cache's block
    tokens (0: no cache)."""
    clock = FakeClock()
    engine = FakeEngine(clock, kv_slots)
    run = Run(engine, [])
    batching = Batching(policy=policy_name, max_batch_size=max_batch_size, **knobs)
    policy = Recording(build_policy(batching), run)
    cache = PrefixCache(cache_block, engine.slots) if cache_block else None
    loop = BatchingLoop(engine, policy, LoopOptions(max_queue=10_000, clock=clock,
                                                    max_prefill_tokens=max_prefill_tokens,
                                                    prefix_cache=cache))
    pending = sorted(enumerate(arrivals), key=lambda a: a[1][0])
    for _ in range(100_000):
        while pending and pending[0][1][0] * MS <= clock.now_ns:
            i, (t_ms, prompt, max_tokens, priority) = pending.pop(0)
            rid = f"r{i}"
            run.events[rid] = []
            ids = prompt_of(i, prompt) if prompt_of else [1] * prompt
            req = Request(request_id=rid, prompt_ids=ids, max_tokens=max_tokens,
                          sink=run.events[rid].append, ignore_eos=True, priority=priority,
                          received_ns=int(t_ms * MS))
            run.requests.append(req)
            loop.enqueue(req)
        if loop.idle and not pending:
            run.held_back = loop.telemetry.counts["plans_held_back"]
            return run
        plan = loop.plan()
        if not plan:
            wake = clock.now_ns + int(plan.wake_in_s * 1e9) if plan.wake_in_s is not None else None
            nxt = int(pending[0][1][0] * MS) if pending else None
            assert wake is not None or nxt is not None, \
                "stuck: nothing planned, nothing to wait for"
            clock.now_ns = max(clock.now_ns + 1, min(t for t in (wake, nxt) if t is not None))
            continue
        loop.apply(plan, *loop.run(plan))
    raise AssertionError("simulation did not finish")


def poisson_arrivals(n, rate_per_ms, prompts=(8, 64), max_tokens=(4, 16), seed=0, priorities=(0,)):
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        t += rng.expovariate(rate_per_ms)
        out.append((t, rng.randint(*prompts), rng.randint(*max_tokens), rng.choice(priorities)))
    return out


def assert_each_finished_once(run: Run, arrivals):
    for i, (_, _, max_tokens, _) in enumerate(arrivals):
        events = run.events[f"r{i}"]
        assert len(events) == max_tokens and all(isinstance(e, TokenEvent) for e in events)
        assert [e.finish_reason is not None for e in events] == [False] * (max_tokens - 1) + [True]
    assert len(run.engine.slots) == run.engine.kv_slots


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_request_finishes_exactly_once(policy):
    arrivals = poisson_arrivals(60, rate_per_ms=0.2, priorities=(0, 1))
    run = simulate(policy, arrivals, max_wait_ms=20, max_step_tokens=48)
    assert_each_finished_once(run, arrivals)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_no_step_prefills_more_than_max_prefill_tokens(policy):
    arrivals = poisson_arrivals(30, rate_per_ms=0.5, prompts=(8, 70), priorities=(0, 1))
    run = simulate(policy, arrivals, max_prefill_tokens=16, max_wait_ms=20, max_step_tokens=48)
    assert_each_finished_once(run, arrivals)
    chunks = collections.Counter()
    for _, _, plan, _ in run.views:
        assert sum(n for _, n in plan.prefill) <= 16
        chunks.update(r.request_id for r, _ in plan.prefill)
    longest = max(range(30), key=lambda i: arrivals[i][1])
    assert chunks[f"r{longest}"] >= 4  # a prompt of up to 70 tokens, 16 at most a step


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_request_finishes_exactly_once_over_the_prefix_cache(policy):
    arrivals = poisson_arrivals(60, rate_per_ms=0.2, prompts=(8, 64), priorities=(0, 1))
    run = simulate(policy, arrivals, max_wait_ms=20, max_step_tokens=48, cache_block=4,
                   prompt_of=lambda i, n: ([i % 3] * 24 + [9] * n)[:n])
    assert_each_finished_once(run, arrivals)
    prefilled = sum(n for _, _, plan, _ in run.views for _, n in plan.prefill)
    assert prefilled < sum(a[1] for a in arrivals)  # the shared prefixes were not prefilled again


def group_prompt(i: int, n: int) -> list[int]:
    """Requests r0, r2, r4... share one prefix; the others have prompts of their own."""
    return [5] * n if i % 2 == 0 else [100 + i] * n


def test_prefix_aware_admits_the_longest_cached_prefix_first():
    # r0 runs alone (one slot); r1 (no hit) and r2 (r0's prompt) wait for it
    arrivals = [(0, 32, 8, 0), (1, 32, 8, 0), (2, 32, 8, 0)]
    orders = {}
    for policy in ("fcfs", "prefix_aware"):
        run = simulate(policy, arrivals, kv_slots=1, max_batch_size=1, max_wait_ms=1000,
                       cache_block=4, prompt_of=group_prompt)
        assert_each_finished_once(run, arrivals)
        orders[policy] = [r.request_id for _, _, plan, _ in run.views for r, _ in plan.prefill]
    assert orders == {"fcfs": ["r0", "r1", "r2"], "prefix_aware": ["r0", "r2", "r1"]}


def test_prefix_aware_admits_a_request_without_a_hit_within_its_age_bound():
    # a steady stream sharing r0's prefix would always win; r1 has none of its own
    arrivals = [(0, 32, 4, 0), (0.5, 32, 4, 0)] + [(1 + 2 * k, 32, 4, 0) for k in range(80)]
    run = simulate("prefix_aware", arrivals, kv_slots=1, max_batch_size=1, max_wait_ms=20,
                   cache_block=4, prompt_of=lambda i, n: [100] * n if i == 1 else [5] * n)
    assert_each_finished_once(run, arrivals)
    admitted_at = next(now for _, _, plan, now in run.views
                       if any(r.request_id == "r1" for r, _ in plan.prefill))
    step_ms = 0.05 * 32 + 2 * N_EXPERTS  # the longest step here: a whole prompt
    assert admitted_at / MS <= 0.5 + 20 + 4 * step_ms  # its bound, then the request before


def test_only_a_load_that_holds_work_back_leaves_a_policy_a_choice():
    alone = [(i * 50.0, 8, 4, 0) for i in range(10)]  # each done before the next arrives
    crowd = [(0.0, 8, 4, 0)] * 12  # 12 at once for 4 batch places
    knobs = {"max_wait_ms": 20, "max_step_tokens": 48}
    for policy in ("fcfs", "expert_aware", "latency_sensitive", "prefix_aware"):
        assert simulate(policy, alone, **knobs).held_back == 0, policy
        assert simulate(policy, crowd, **knobs).held_back > 0, policy
    for policy in ("static", "dynamic"):  # they wait for company: a choice even when alone
        assert simulate(policy, alone, **knobs).held_back > 0, policy
    # a prompt cut to the step's budget is held back too
    assert simulate("fcfs", [(0.0, 64, 4, 0)], max_prefill_tokens=16).held_back == 3


def test_static_never_admits_mid_batch():
    arrivals = poisson_arrivals(40, rate_per_ms=0.5)
    run = simulate("static", arrivals, max_wait_ms=10)
    assert_each_finished_once(run, arrivals)
    for resident, _, plan, _ in run.views:
        if plan.prefill:
            assert not resident
        assert len(plan.prefill) <= 4


def test_static_waits_for_a_full_batch_or_the_wait_bound():
    run = simulate("static", [(0, 8, 4, 0), (1, 8, 4, 0), (30, 8, 4, 0)], max_wait_ms=10)
    admitted = [(v[3], [r.request_id for r, _ in v[2].prefill]) for v in run.views if v[2].prefill]
    assert admitted[0] == (10 * MS, ["r0", "r1"])  # batch not full: went when r0 had waited 10 ms


def test_fcfs_keeps_arrival_order():
    arrivals = poisson_arrivals(40, rate_per_ms=0.5)
    run = simulate("fcfs", arrivals)
    order = [r.request_id for _, _, plan, _ in run.views for r, _ in plan.prefill]
    assert order == [f"r{i}" for i in sorted(range(40), key=lambda i: arrivals[i][0])]


def test_dynamic_admits_one_bucket_at_a_time_within_the_wait_bound():
    # Room for everyone, so only the policy's own waiting can delay an admission.
    arrivals = poisson_arrivals(60, rate_per_ms=0.3, prompts=(2, 200))
    run = simulate("dynamic", arrivals, kv_slots=64, max_batch_size=64, max_wait_ms=15)
    assert_each_finished_once(run, arrivals)
    longest_step_ms = 0.05 * 64 * 200 + 2 * N_EXPERTS
    for _, _, plan, now in run.views:
        assert len({length_bucket(len(r.prompt_ids)) for r, _ in plan.prefill}) <= 1
        for r, _ in plan.prefill:
            assert (now - r.received_ns) / MS <= 15 + longest_step_ms


def test_expert_aware_activates_fewer_experts_and_serves_everyone_within_the_age_bound():
    arrivals = poisson_arrivals(80, rate_per_ms=0.4, prompts=(4, 8), max_tokens=(20, 30))
    fcfs = simulate("fcfs", arrivals, kv_slots=8, max_batch_size=4, max_wait_ms=40)
    aware = simulate("expert_aware", arrivals, kv_slots=8, max_batch_size=4, max_wait_ms=40)
    assert_each_finished_once(aware, arrivals)

    def mean_active(run):
        return sum(run.engine.active_per_step) / len(run.engine.active_per_step)

    assert mean_active(aware) < 0.9 * mean_active(fcfs)
    longest_step_ms = 0.05 * 4 * 8 + 2 * N_EXPERTS
    last_run = {}
    for _, _, plan, now in aware.views:
        for r in plan.decode:
            if r.request_id in last_run:
                assert (now - last_run[r.request_id]) / MS <= 40 + 2 * longest_step_ms
            last_run[r.request_id] = now


def test_latency_sensitive_keeps_the_budget_and_never_skips_a_decode():
    arrivals = poisson_arrivals(50, rate_per_ms=0.2, prompts=(4, 300), priorities=(0, 5))
    run = simulate("latency_sensitive", arrivals, kv_slots=8, max_batch_size=8, max_step_tokens=64)
    assert_each_finished_once(run, arrivals)
    for _, decoding, plan, _ in run.views:
        tokens = sum(n for _, n in plan.prefill) + len(plan.decode)
        assert tokens <= 64
        assert decoding == {r.request_id for r in plan.decode}


def test_latency_sensitive_admits_higher_priority_first():
    run = simulate("latency_sensitive", [(0, 100, 4, 0), (0, 100, 4, 0), (0, 100, 4, 9)],
                   kv_slots=1, max_batch_size=1, max_step_tokens=64)
    first = next(plan for _, _, plan, _ in run.views if plan.prefill)
    assert first.prefill[0][0].request_id == "r2"


def test_routing_keys_give_distinct_signatures():
    assert len({request_key(f"r{i}", 0) % N_EXPERTS for i in range(32)}) > 4


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_real_server_streams_exact_token_counts(policy):
    with running_server(policy=policy, max_batch_size=4, kv_slots=6, max_wait_ms=5,
                        max_step_tokens=16) as served:
        calls = [served.stub.Generate(moe_pb2.GenerateRequest(prompt="p" * (3 + 9 * i),
                                                              max_tokens=5 + i, ignore_eos=True,
                                                              priority=i % 2), timeout=60)
                 for i in range(8)]
        counts = [sum(len(m.token_ids) for m in call) for call in calls]
        stats = served.stub.GetStats(moe_pb2.GetStatsRequest())
    assert counts == [5 + i for i in range(8)]
    assert stats.policy == policy and stats.requests_finished == 8 and stats.running == 0
    assert stats.policy_knobs["max_batch_size"] == 4


def test_dynamic_serves_the_oldest_bucket_within_its_wait_bound_against_full_buckets():
    # One long prompt, then a stream of short ones that keeps filling their own bucket.
    arrivals = [(0, 200, 4, 0)] + [(1 + 10 * i, 8, 4, 0) for i in range(60)]
    run = simulate("dynamic", arrivals, kv_slots=2, max_batch_size=2, max_wait_ms=20)
    assert_each_finished_once(run, arrivals)
    admitted_at = next(now for _, _, plan, now in run.views
                       if any(r.request_id == "r0" for r, _ in plan.prefill))
    assert admitted_at / MS <= 20 + 2 * (0.05 * 2 * 200 + 2 * N_EXPERTS)
