"""The fixed-shape decode step CUDA graphs capture (server/engine/decode_graphs.py), run eagerly
on the CPU: greedy tokens identical to the dynamic path's and to transformers' generate() per
architecture, sampled ones too; padding rows counted nowhere; every dispatched shape fixed by the
batch bucket alone; one host read a step and no operation that would wait for a GPU; the
operations a layer dispatches within a budget; decode attention over each sequence's own
positions equal to masked SDPA's; and where graphs cannot run, the reason."""

import dataclasses
import logging

import pytest
import torch

from records.server_settings import MoE
from server.engine.decode_attention import GatheredDecode, flash_decode_unsupported
from server.engine.decode_graphs import bucket_sizes, fixed_shape_problem
from server.engine.interface import SeqInput
from server.engine.local import EngineOptions, LocalEngine
from server.engine.model import causal_attention
from server.engine.model_args import PRESETS
from server.engine.stages import NullTimer
from tests.checkpoints import ARCHITECTURES, write_checkpoint
from tests.dispatch import DeviceWaits, Dispatched

TINY = PRESETS["tiny"]
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11] * 20]


def engine(graphs: str, args=TINY, moe: MoE = MoE(), slots: int = 6) -> LocalEngine:
    return LocalEngine(args, slots, "cpu", torch.float32, 0, EngineOptions(moe, graphs=graphs))


def generate(e: LocalEngine, prompts: list[list[int]], steps: int, temperature: float = 0.0
             ) -> list[list[int]]:
    """Each prompt prefilled in one step, then `steps` decode steps of all of them."""
    first = e.step([SeqInput(i, p, 0, temperature=temperature, seed=i)
                    for i, p in enumerate(prompts)])
    tokens = [[t] for t in first.next_ids]
    for _ in range(steps):
        seqs = [SeqInput(i, [t[-1]], len(p) + len(t) - 1, temperature=temperature)
                for i, (p, t) in enumerate(zip(prompts, tokens, strict=True))]
        for t, n in zip(tokens, e.step(seqs).next_ids, strict=True):
            t.append(n)
    return tokens


@pytest.mark.parametrize("moe", [MoE(), MoE(routing_skew="affinity:0.1"),
                                 MoE(moe_kernel="grouped_mm")], ids=["topk", "affinity",
                                                                     "grouped_mm"])
def test_fixed_shape_decode_gives_the_dynamic_paths_tokens(moe):
    fixed = engine("eager", moe=moe)
    assert fixed.graphs is not None and fixed.graphs.sizes == [1, 2, 4, 6]
    assert generate(fixed, PROMPTS, 24) == generate(engine("off", moe=moe), PROMPTS, 24)


def test_kept_routing_is_each_tokens_experts_through_either_path():
    """--enable-return-routed-experts: a prefill step's token_experts hold every prompt token's
    experts, and a decode step's the same ids through the fixed-shape step as eagerly."""
    results = {}
    for graphs in ("eager", "off"):
        e = LocalEngine(TINY, 6, "cpu", torch.float32, 0,
                        EngineOptions(graphs=graphs, keep_routing=True))
        first = e.step([SeqInput(i, p, 0) for i, p in enumerate(PROMPTS)])
        assert first.token_experts.shape == (sum(map(len, PROMPTS)), TINY.n_layers, TINY.top_k)
        seqs = [SeqInput(i, [t], len(p)) for i, (p, t) in enumerate(
            zip(PROMPTS, first.next_ids, strict=True))]
        step = e.step(seqs)
        ids = step.token_experts.long()
        assert ids.shape == (len(PROMPTS), TINY.n_layers, TINY.top_k)
        used = torch.zeros_like(step.seq_experts).scatter_(2, ids, True)
        assert (used == step.seq_experts).all()
        results[graphs] = ids.sort(-1).values
    assert (results["eager"] == results["off"]).all()
    assert engine("off").step([SeqInput(0, [1, 2], 0)]).token_experts is None


def test_sampled_tokens_are_the_same_through_the_fixed_shape_step():
    assert generate(engine("eager"), PROMPTS, 16, 0.9) == generate(engine("off"), PROMPTS, 16, 0.9)


def test_a_sliding_window_is_honoured_in_fixed_shapes():
    args = dataclasses.replace(TINY, sliding_window=5)
    fixed, dynamic = engine("eager", args), engine("off", args)
    assert generate(fixed, PROMPTS, 12) == generate(dynamic, PROMPTS, 12)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_fixed_shape_greedy_tokens_equal_transformers_generate(tmp_path, name):
    from server.engine.checkpoint import open_checkpoint

    model = write_checkpoint(tmp_path, name)
    e = LocalEngine.from_checkpoint(open_checkpoint(str(tmp_path)), 4, "cpu", torch.float32, 0,
                                    graphs="eager")
    assert e.graphs is not None
    prompts = [e.tokenizer.encode(p) for p in ("mixture of experts", "route every token")]
    model.generation_config.eos_token_id = None
    for prompt, tokens in zip(prompts, generate(e, prompts, 15), strict=True):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)
        assert tokens == out[0, len(prompt):].tolist(), name


def decode_step(e: LocalEngine, n: int, start: int = 5) -> list[SeqInput]:
    """n sequences prefilled with different lengths; their next decode step's inputs."""
    e.step([SeqInput(i, [1 + i] * (start + i), 0) for i in range(n)])
    return [SeqInput(i, [2], start + i) for i in range(n)]


def test_padding_rows_are_counted_nowhere():
    fixed, dynamic = engine("eager"), engine("off")
    a, b = (e.step(decode_step(e, 3)) for e in (fixed, dynamic))  # 3 rows padded to 4
    assert fixed.graphs.bucket(3) == 4
    assert a.routed.sum(dim=1).tolist() == [3 * TINY.top_k] * TINY.n_layers
    assert torch.equal(a.routed, b.routed) and torch.equal(a.seq_experts, b.seq_experts)
    assert a.active == b.active and a.tokens == 3 and a.next_ids == b.next_ids
    assert a.kv_useful == b.kv_useful and a.kv_computed == a.kv_useful + 1


def test_every_dispatched_shape_is_fixed_by_the_bucket_alone():
    """Two steps of the same bucket (3 and 4 sequences, other slots and lengths) dispatch the
    same operations on the same shapes in what a graph captures: one graph serves both."""
    signatures = []
    for n, start in ((3, 5), (4, 40)):
        e = engine("eager", slots=8)
        seqs = decode_step(e, n, start)
        size = e.graphs.load([2] * n, [s.start_pos for s in seqs], [s.slot for s in seqs])
        with Dispatched() as seen:
            e.graphs.forward(size, NullTimer())
        signatures.append(seen.shapes)
    assert signatures[0] == signatures[1]


@pytest.mark.parametrize("graphs", ["eager", "off"])
def test_a_decode_step_reads_the_host_once_and_nothing_waits_for_the_device(graphs,
                                                                             monkeypatch):
    e = engine(graphs, moe=MoE(moe_kernel="grouped_mm"), slots=8)
    seqs = decode_step(e, 5)
    seqs[1].temperature = 0.7
    with DeviceWaits(monkeypatch) as waits:
        result = e.step(seqs)
    assert result.host_transfers == 1
    assert waits.seen == []


# aten operations one layer of the fixed-shape decode step dispatches on the CPU (views included),
# OLMoE's structure (q/k norms over the whole projection, no renormalised weights): 101 when set
# (111 before the rotary embedding took three kernels); a new operation in every layer is a new
# kernel in every graph
LAYER_OPS_BUDGET = 104


def test_a_layer_dispatches_within_its_operation_budget():
    olmoe_like = dataclasses.replace(TINY, n_experts=16, top_k=4, qk_norm="full",
                                     renormalize=False)
    totals = []
    for layers in (2, 4):
        e = engine("eager", dataclasses.replace(olmoe_like, n_layers=layers), slots=8)
        seqs = decode_step(e, 5)
        size = e.graphs.load([2] * 5, [s.start_pos for s in seqs], [s.slot for s in seqs])
        with Dispatched() as seen:
            e.graphs.forward(size, NullTimer())
        totals.append(seen.total)
    per_layer = (totals[1] - totals[0]) / 2
    assert per_layer <= LAYER_OPS_BUDGET, per_layer


def test_decode_attention_over_own_positions_equals_masked_sdpa():
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache = (torch.randn(5, 2, 32, 8, generator=gen) for _ in range(2))
    q = torch.randn(3, 4, 8, generator=gen)
    slots, lens = torch.tensor([4, 0, 2]), torch.tensor([7, 1, 32])
    got = GatheredDecode.plan(slots, lens, 2, 32)(q, k_cache, v_cache)
    for b in range(3):
        s, n = int(slots[b]), int(lens[b])
        want = causal_attention(q[b][None, :, None], k_cache[s, :, :n][None],
                                v_cache[s, :, :n][None], n - 1, 0)
        torch.testing.assert_close(got[b], want[0, :, 0])


def test_buckets_pad_up_to_the_pool():
    assert bucket_sizes(1) == [1]
    assert bucket_sizes(40) == [1, 2, 4, 8, 16, 24, 32, 40]
    assert bucket_sizes(64)[-2:] == [48, 64]


def test_where_graphs_cannot_run_the_reason_is_given(caplog):
    with caplog.at_level(logging.INFO):
        assert engine("auto").graphs is None  # a CPU: no graphs, quietly
    assert "CUDA graph" not in caplog.text
    assert "cuda" in flash_decode_unsupported(TINY, torch.device("cpu"), torch.float32).lower()
    common = dict(grouped=None, cached=False, capacity=False, spread=False, router="topk",
                  attention=None)
    assert fixed_shape_problem(**common) is None
    changes = ((dict(cached=True), "expert cache"), (dict(capacity=True), "capacity"),
               (dict(router="balanced"), "balanced"), (dict(grouped="no"), "grouped_mm"))
    for change, words in changes:
        assert words in fixed_shape_problem(**common | change)
    assert engine("eager", moe=MoE(expert_cache=2)).graphs is None
