"""The MoE layer's parts against plain definitions: expert kernels against the per-token
reference (edge cases included), routers (k distinct experts, ties, noise, least-loaded
balance, custom routers), routing skew, expert capacity and drops, the expert-weight cache
(same output, real counters, eviction policies) and stage timing."""

import dataclasses
import random
import time

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from records.declare import flat
from records.server_settings import MoE
from server.engine import kernels
from server.engine.expert_cache import LayerCache
from server.engine.interface import SeqInput
from server.engine.kernels import KERNELS, grouped_mm_unsupported, linear, resolve_kernel
from server.engine.local import LocalEngine
from server.engine.model import Transformer
from server.engine.model_args import PRESETS
from server.engine.moe import StepContext, expert_capacity
from server.engine.routers import (
    BalancedRouter,
    NoisyTopKRouter,
    Skew,
    TopKRouter,
    hot_bias,
    request_key,
    router_class,
    router_options,
)
from server.engine.stages import STAGES, StageTimer
from tests.dispatch import DeviceWaits

TINY = PRESETS["tiny"]
E, K = TINY.n_experts, TINY.top_k


def weights(seed=0, e=E, i=TINY.expert_dim, d=TINY.dim):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=g) / shape[-1] ** 0.5
                 for shape in ((e, 2 * i, d), (e, d, i)))


@pytest.mark.parametrize("counts", [[3, 0, 5, 1], [0, 0, 9, 0], [0, 1, 0, 0], [4, 4, 4, 4]],
                         ids=["random", "one-expert", "single-token", "even"])
@pytest.mark.parametrize("kernel", ["sorted", "batched", "grouped_mm"])
def test_kernels_match_the_per_token_reference(kernel, counts):
    w = weights()
    if kernel == "grouped_mm" and (why := grouped_mm_unsupported((TINY.expert_dim, TINY.dim),
                                                                 w[0].device, w[0].dtype)):
        pytest.skip(why)
    xs = torch.randn(sum(counts), TINY.dim, generator=torch.Generator().manual_seed(1))
    expected = KERNELS["reference"](xs, counts, range(E), *w)
    torch.testing.assert_close(KERNELS[kernel](xs, counts, range(E), *w), expected,
                               rtol=1e-5, atol=1e-5)


class OpCounter(TorchDispatchMode):
    """Counts the torch operators run under it: on a GPU, each one a kernel launch or less."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def test_batched_launches_a_fixed_number_of_kernels_where_sorted_launches_per_expert():
    e, i, d = 64, 16, 32
    w = weights(e=e, i=i, d=d)
    g = torch.Generator().manual_seed(2)
    ops = {}
    for used in (32, 64):
        counts = [1 + n % 3 if n < used else 0 for n in range(e)]
        xs = torch.randn(sum(counts), d, generator=g)
        for kernel in ("sorted", "batched"):
            with OpCounter() as counter:
                ys = KERNELS[kernel](xs, counts, range(e), *w)
            ops[kernel, used] = counter.ops
        torch.testing.assert_close(ys, KERNELS["sorted"](xs, counts, range(e), *w))
    # batched's operators: about a dozen on the host's index tensors, eight on the device
    assert ops["batched", 32] == ops["batched", 64] <= 25
    assert ops["sorted", 64] - ops["sorted", 32] >= 4 * 32  # a matmul chain per group


def test_batched_is_sorted_where_padding_would_cost():
    e = 8
    w = weights(e=e)
    g = torch.Generator().manual_seed(3)
    for counts in ([kernels.BATCHED_MAX_ROWS + 1] + [1] * (e - 1),  # one group too deep
                   [2, 2, 2] + [0] * (e - 3)):  # most experts idle: their weights read for nothing
        xs = torch.randn(sum(counts), TINY.dim, generator=g)
        ops = []
        for kernel in ("batched", "sorted"):
            with OpCounter() as counter:
                KERNELS[kernel](xs, counts, range(e), *w)
            ops.append(counter.ops)
        assert ops[0] == ops[1]


def moe_layer(seed=0, dtype=torch.float32, **settings):
    """Layer 0 of a tiny model built with these MoE settings (the same weights for the same
    seed)."""
    model = Transformer(TINY, MoE(**settings), seed, dtype=dtype)
    model.init_random(seed)
    return model.layers[0].moe


def context(n, groups=None):
    groups = torch.arange(n) if groups is None else groups
    return StepContext(groups, int(groups.max()) + 1, StageTimer(torch.device("cpu")))


@pytest.mark.parametrize("kernel", ["sorted", "reference"])
def test_layer_matches_reference(kernel):
    layer = moe_layer(dtype=torch.float64, moe_kernel=kernel)
    x = torch.randn(23, TINY.dim, dtype=torch.float64)
    step = context(23)
    torch.testing.assert_close(layer(x, step), layer.reference(x, context(23)))
    assert step.routed[0].sum() == 23 * K and step.active[0] <= E


def test_topk_ties_go_to_the_lower_expert_id():
    router = TopKRouter(TINY, 0, 0, "cpu", torch.float32)
    nn.init.zeros_(router.gate.weight)  # every expert scores the same
    weights_, experts = router(torch.randn(5, TINY.dim), None, torch.arange(5))
    assert experts.tolist() == [[0, 1]] * 5
    torch.testing.assert_close(weights_, torch.full((5, K), 1 / K))


def test_noisy_topk_is_seeded_and_distinct():
    def route(seed):
        router = NoisyTopKRouter(TINY, 0, seed, "cpu", torch.float32, noise_scale=5.0)
        nn.init.normal_(router.gate.weight, generator=torch.Generator().manual_seed(1))
        nn.init.normal_(router.w_noise.weight, generator=torch.Generator().manual_seed(2))
        x = torch.randn(64, TINY.dim, generator=torch.Generator().manual_seed(3))
        return router(x, None, torch.arange(64))[1]

    a, b, c = route(0), route(0), route(1)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert all(len(set(row)) == K for row in a.tolist())


def test_balanced_router_spreads_groups_over_least_loaded_experts():
    router = BalancedRouter(TINY, 0, 0, "cpu", torch.float32)
    groups = torch.tensor([0, 0, 0, 1, 2, 3, 4, 5, 6])  # one 3-token prefill, six decodes
    _, experts = router(torch.randn(9, TINY.dim), None, groups)
    loads = torch.bincount(experts.flatten(), minlength=E).tolist()
    assert sorted(loads) == [4, 4, 5, 5]  # 18 slots as even as groups allow
    assert all(len(set(row)) == K for row in experts.tolist())
    assert len({tuple(r) for r in experts[:3].tolist()}) == 1  # a group stays together


class FirstExpertsRouter(nn.Module):
    """A custom router for the test below: always experts 0..k-1, equal weights."""

    def __init__(self, args, layer, seed, device, dtype, **_):
        super().__init__()
        self.top_k = args.top_k

    def forward(self, x, bias, groups):
        experts = torch.arange(self.top_k).expand(x.shape[0], -1)
        return torch.full(experts.shape, 1 / self.top_k), experts


def test_a_router_is_given_the_settings_it_names():
    class Named(nn.Module):
        def __init__(self, args, layer, seed, device, dtype, noise_scale, renormalize=None):
            super().__init__()

    settings = flat(MoE(noise_scale=2.0))
    assert router_options(Named, settings) == {"noise_scale": 2.0}  # renormalize unset: not given
    assert router_options(Named, flat(MoE(renormalize=False)))["renormalize"] is False
    # noise_scale is noisy_topk's only; the built-in routers read renormalize from their args
    assert router_options(TopKRouter, flat(MoE(renormalize=False))) == {}
    unset = {name for name, value in settings.items() if value is None}
    # With **kwargs, every setting that is set.
    assert set(router_options(FirstExpertsRouter, settings)) == set(settings) - unset


@pytest.mark.parametrize("router", ["topk", "noisy_topk", "balanced"])
def test_the_renormalize_setting_reaches_the_built_in_routers_through_their_args(router):
    for model_says, setting, expected in ((True, None, True), (True, False, False),
                                          (False, True, True), (False, None, False)):
        args = dataclasses.replace(TINY, renormalize=model_says)
        model = Transformer(args, MoE(router=router, renormalize=setting))
        assert {b.moe.router.renormalize for b in model.layers} == {expected}


def test_custom_router_loads_by_dotted_path():
    assert router_class("tests.test_moe:FirstExpertsRouter") is FirstExpertsRouter
    layer = moe_layer(router="tests.test_moe:FirstExpertsRouter")
    step = context(6)
    layer(torch.randn(6, TINY.dim), step)
    assert step.routed[0].tolist() == [6, 6, 0, 0]
    with pytest.raises(ValueError, match="cannot load router"):
        router_class("tests.test_moe:Missing")


def routed_share(layer, n=4096, groups=None):
    step = context(n, groups)
    layer(torch.randn(n, TINY.dim, generator=torch.Generator().manual_seed(7)), step)
    return (step.routed[0] / step.routed[0].sum()).tolist()


def test_zipf_skew_follows_popularity():
    layer = moe_layer(routing_skew="zipf:1.5")
    assert torch.equal(layer.skew_bias, Skew.parse("zipf:1.5").layer_bias(E, K, 0, seed=0))
    share = routed_share(layer)
    popularity = layer.skew_bias.argsort(descending=True).tolist()
    assert share[popularity[0]] > 0.3 > 1 / E and share[popularity[0]] > share[popularity[-1]] * 3


def test_hot_skew_gives_the_hot_expert_its_fraction():
    layer = moe_layer(routing_skew="hot:0.4")
    hot = int(layer.skew_bias.argmax())
    assert routed_share(layer)[hot] == pytest.approx(0.4, abs=0.05)
    with pytest.raises(ValueError, match="at most 1/k"):
        Skew.parse("hot:0.6").layer_bias(E, K, 0, seed=0)
    assert hot_bias(1 / E, E, K) == pytest.approx(0, abs=0.1)  # no bias for a uniform share


def test_affinity_skew_is_per_request_and_stable():
    skew = Skew.parse("affinity:0.05")
    a1 = skew.request_bias(2, E, request_key("a", 0), seed=0)
    assert torch.equal(a1, skew.request_bias(2, E, request_key("a", 0), seed=0))
    assert not torch.equal(a1, skew.request_bias(2, E, request_key("b", 0), seed=0))
    # One preference, laid out per layer by the model's permutations: the same values in every
    # layer.
    assert torch.equal(a1[0].sort().values, a1[1].sort().values)
    layer = moe_layer()
    step = context(2)
    step.token_bias = torch.stack([a1, a1])  # both tokens from request "a"
    layer(torch.randn(2, TINY.dim), step)
    assert step.routed[0][int(a1[0].argmax())] == 2  # both go to the request's favourite


@pytest.mark.parametrize("spec", ["zipf", "hot:2", "affinity:0", "zipf:-1", "heavy:1"])
def test_bad_skew_is_refused(spec):
    with pytest.raises(ValueError):
        Skew.parse(spec)


def test_capacity_drops_over_capacity_pairs_and_counts_them():
    assert expert_capacity(tokens=10, top_k=2, n_experts=4, capacity_factor=1.0) == 5
    assert expert_capacity(tokens=10, top_k=2, n_experts=4, capacity_factor=1.25) == 7
    router = "tests.test_moe:FirstExpertsRouter"  # all 8 tokens to experts 0 and 1
    layer = moe_layer(router=router, capacity_factor=1.0)  # capacity ceil(8*2/4) = 4 per expert
    x = torch.randn(8, TINY.dim)
    step = context(8)
    out = layer(x, step)
    assert step.dropped[0].tolist() == [4, 4, 0, 0] and step.active[0] == 2
    # later tokens kept only their residual
    torch.testing.assert_close(out[4:], torch.zeros_like(out[4:]))
    torch.testing.assert_close(out[:4], moe_layer(router=router)(x, context(8))[:4])


def test_expert_cache_gives_the_same_output_and_counts_copies():
    x = torch.randn(40, TINY.dim, generator=torch.Generator().manual_seed(5))
    plain = moe_layer()
    expected = plain(x, context(40))
    cached = moe_layer(expert_cache=2)
    torch.testing.assert_close(cached(x, context(40)), expected)
    cached.cache.settle()
    c = cached.cache.counters
    expert_bytes = sum(w[0].numel() * 4 for w in cached.experts.weights)
    assert c.misses == E and c.evictions == E - 2 and c.bytes_copied == E * expert_bytes
    assert c.copy_ms > 0 and c.wait_ms == c.copy_ms


@pytest.mark.parametrize("policy, evicted", [("lru", 2), ("lfu", 1)])
def test_eviction_policies(policy, evicted):
    host = weights(e=4)
    cache = LayerCache(host, capacity=2, device=torch.device("cpu"), policy=policy)
    for wave in ([1], [2], [2], [2], [1]):  # expert 2 used more often, expert 1 more recently
        cache.ensure(wave)
    cache.ensure([3])
    assert set(cache.slot_of) == {1, 2, 3} - {evicted}
    assert torch.equal(cache.resident[0][cache.slot_of[3]], host[0][3])
    assert (cache.counters.hits, cache.counters.misses, cache.counters.evictions) == (3, 3, 1)


def test_random_eviction_is_seeded():
    def evicted(seed):
        cache = LayerCache(weights(e=4), capacity=2, device=torch.device("cpu"), policy="random",
                           rng=random.Random(seed))
        for e in (0, 1, 2, 3, 0, 2, 1, 3):
            cache.ensure([e])
        return list(cache.slot_of)

    assert evicted(0) == evicted(0)


@pytest.mark.timing  # wall time against the stages: a busy machine preempts between them
def test_stage_times_add_up_to_the_step():
    engine = LocalEngine.from_preset("tiny", kv_slots=4, device="cpu", dtype=torch.float32, seed=0)
    seqs = [SeqInput(0, [1] * 40, 0), SeqInput(1, [2], 5), SeqInput(2, [3], 9)]
    start = time.perf_counter()
    result = engine.step(seqs)
    wall_ms = (time.perf_counter() - start) * 1000
    assert set(result.stage_ms) == set(STAGES)
    assert all(v > 0 for stage, v in result.stage_ms.items() if stage != "dispatch")
    assert result.stage_ms["dispatch"] == 0  # every expert is in this process
    total = sum(result.stage_ms.values())
    assert total <= wall_ms and total >= 0.8 * wall_ms - 0.5  # stated tolerance: 20% or 0.5 ms


@pytest.mark.parametrize("moe", [
    MoE(router="balanced"), MoE(router="noisy_topk"), MoE(capacity_factor=1.0),
    MoE(moe_kernel="grouped_mm"), MoE(expert_cache=2, cache_policy="random"),
    MoE(routing_skew="affinity:0.1"), MoE(routing_skew="hot:0.3"),
], ids=str)
def test_engine_runs_with_every_option(moe):
    engine = LocalEngine.from_preset("tiny", kv_slots=2, device="cpu",
                                     dtype=torch.float32, seed=0, moe=moe)
    result = engine.step([SeqInput(0, [5] * 6, 0, routing_key=11),
                          SeqInput(1, [7] * 3, 0, routing_key=12)])
    assert len(result.next_ids) == 2 and result.routed.sum() == 9 * K * TINY.n_layers
    assert (result.dropped is not None) == (moe.capacity_factor is not None)


def test_renormalisation_follows_the_preset():
    x = torch.randn(6, TINY.dim)
    plain = TopKRouter(TINY, 0, 0, "cpu", torch.float32)
    assert torch.allclose(plain(x, None, torch.arange(6))[0].sum(-1), torch.ones(6))
    unnormalized = TINY.__class__(**{**vars(TINY), "renormalize": False})
    qwen_like = TopKRouter(unnormalized, 0, 0, "cpu", torch.float32)
    qwen_like.gate.load_state_dict(plain.gate.state_dict())
    assert (qwen_like(x, None, torch.arange(6))[0].sum(-1) < 1).all()
    assert not PRESETS["qwen1.5-moe-a2.7b"].renormalize and PRESETS["mixtral-8x7b"].renormalize


@pytest.mark.parametrize("rows, out", [(1, 3072), (4, 768), (64, 1536), (65, 3072), (3, 200),
                                       (2, 8)])
def test_split_linear_equals_the_plain_matmul(rows, out):
    # few rows on a CPU: a batched matmul over blocks of the weight (more rows, odd or small
    # shapes: the plain product)
    g = torch.Generator().manual_seed(rows)
    h, w = torch.randn(rows, 96, generator=g), torch.randn(out, 96, generator=g)
    torch.testing.assert_close(linear(h, w), h @ w.T, rtol=1e-5, atol=1e-4)


def test_auto_is_sorted_off_cuda_and_the_probe_compares_with_sorted(monkeypatch, caplog):
    shape = (TINY.expert_dim, TINY.dim)
    cpu = torch.device("cpu")
    with caplog.at_level("INFO", logger="server.engine.kernels"):
        assert resolve_kernel("auto", shape, cpu, torch.float32, cached=False) == "sorted"
    assert "MoE kernel sorted (--moe-kernel auto: on cpu, where batched's padding rows cost" \
        in caplog.text
    if grouped_mm_unsupported(shape, cpu, torch.float32):
        pytest.skip("this torch has no CPU _grouped_mm to probe")
    # a grouped kernel that is wrong on the probe's random input is refused, with by how much
    monkeypatch.setattr(kernels, "grouped_mm_experts",
                        lambda xs, *rest: kernels.sorted_experts(xs, *rest) * 1.5)
    why = grouped_mm_unsupported(shape, cpu, torch.float32)
    assert why.startswith("its output differs from the sorted kernel's by up to ")
    assert resolve_kernel("grouped_mm", shape, cpu, torch.float32, cached=False) == "sorted"


@pytest.mark.parametrize("moe", [
    MoE(), MoE(moe_kernel="batched"), MoE(moe_kernel="grouped_mm"),
    MoE(moe_kernel="grouped_mm", capacity_factor=1.0), MoE(routing_skew="affinity:0.1"),
], ids=str)
def test_a_step_waits_for_the_device_only_where_it_counts(moe, monkeypatch):
    """Nothing in a step (prefill, decode, a resumed prompt, sampling at a temperature) reads
    the device behind the counted transfers' back. Copies to the device that wait (from
    pageable memory) cannot be seen on a CPU; tests/test_gpu.py counts those on CUDA."""
    engine = LocalEngine.from_preset("tiny", kv_slots=4, device="cpu",
                                     dtype=torch.float32, seed=0, moe=moe)
    with DeviceWaits(monkeypatch) as waits:
        engine.step([SeqInput(0, [1] * 7, 0, temperature=0.8), SeqInput(1, [2] * 3, 0)])
        engine.step([SeqInput(0, [5], 7, temperature=0.8), SeqInput(1, [2] * 4, 3),
                     SeqInput(2, [1] * 4, 0)])
    assert waits.seen == []
    with DeviceWaits(monkeypatch) as waits:  # it would see them
        torch.bincount(torch.tensor([1, 2]))
        torch.multinomial(torch.tensor([0.5, 0.5]), 1)
        torch.ones(2).tolist()
    assert waits.seen[:2] == ["aten.bincount.default", "aten.multinomial.default"]
    assert waits.seen[2].startswith("tolist in test_moe.py:")


@pytest.mark.parametrize("kernel, capacity_factor, per_layer", [
    ("sorted", None, 1), ("sorted", 1.0, 1), ("batched", None, 1), ("grouped_mm", None, 0)])
def test_a_step_reads_the_device_within_its_budget(kernel, capacity_factor, per_layer):
    # one transfer at the step's end (the sampled tokens with the routing statistics), and one
    # per MoE layer on the sorted and batched kernels (the expert counts), none on the grouped
    # kernel
    moe = MoE(moe_kernel=kernel, capacity_factor=capacity_factor)
    engine = LocalEngine.from_preset("tiny", kv_slots=3, device="cpu",
                                     dtype=torch.float32, seed=0, moe=moe)
    if engine.kernel_name != kernel:
        pytest.skip(f"{kernel} is not available here")
    prefill = engine.step([SeqInput(0, [1] * 7, 0), SeqInput(1, [2] * 3, 0)])
    decode = engine.step([SeqInput(0, [5], 7), SeqInput(1, [6], 3), SeqInput(2, [1] * 4, 0)])
    for result in (prefill, decode):
        assert result.host_transfers == 1 + per_layer * TINY.n_layers
        assert len(result.active) == TINY.n_layers and all(isinstance(a, int)
                                                            for a in result.active)
        assert result.seq_experts.dtype == torch.bool
    reference = LocalEngine.from_preset("tiny", kv_slots=3, device="cpu", dtype=torch.float32,
                                        seed=0, moe=MoE(moe_kernel="reference",
                                                        capacity_factor=capacity_factor))
    reference.step([SeqInput(0, [1] * 7, 0), SeqInput(1, [2] * 3, 0)])
    expected = reference.step([SeqInput(0, [5], 7), SeqInput(1, [6], 3),
                               SeqInput(2, [1] * 4, 0)])
    assert decode.next_ids == expected.next_ids and decode.active == expected.active
    assert torch.equal(decode.routed, expected.routed)


def test_kernels_timed_at_start_up_pick_the_fastest_per_size():
    """The per-token reference is far slower than sorted once a call has many pairs: the table
    built from real timings takes sorted there, and each call goes to its size's row."""
    gen = torch.Generator().manual_seed(0)
    w13 = torch.randn(8, 2 * 32, 64, generator=gen) / 8
    w2 = torch.randn(8, 64, 32, generator=gen) / 6
    table, times = kernels.time_kernels(["reference", "sorted"], w13, w2, top_k=2,
                                        tokens=(16, 64), repeats=3)
    assert set(times) == {16, 64} and set(times[64]) == {"reference", "sorted"}
    assert times[64]["reference"] > times[64]["sorted"]
    assert table.pick(128) is kernels.sorted_experts and table.rows[-1][1] == "sorted"
    mixed = kernels.KernelTable(((64, "reference"), (2**62, "sorted")))
    assert mixed.pick(64) is kernels.per_token_experts and mixed.pick(65) is kernels.sorted_experts
    xs = torch.randn(6, 64, generator=gen)
    torch.testing.assert_close(mixed(xs, [2, 0, 4, 0, 0, 0, 0, 0], range(8), w13, w2),
                               kernels.sorted_experts(xs, [2, 0, 4, 0, 0, 0, 0, 0], range(8),
                                                      w13, w2))
    assert str(mixed) == "reference up to 64 pairs, sorted above"
