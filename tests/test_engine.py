"""The engine computes what the plain definitions say: batched continuous-batching decode
equals one request at a time, whatever the router, kernel or expert cache; and `gpu_check` runs
its CPU parts here, naming what it skipped; prefill attention, causal without a mask, equals the
masked definition."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from records.server_settings import MoE
from server.engine.interface import SeqInput
from server.engine.layouts import StepLayout
from server.engine.local import LocalEngine, indexed
from server.engine.model import causal_attention, masked_attention
from server.engine.model_args import PRESETS
from server.engine.moe import StepContext
from tests.conftest import REPO


def greedy_alone(engine: LocalEngine, prompt: list[int], n: int, key: int) -> list[int]:
    out = []
    tokens, pos = prompt, 0
    for _ in range(n):
        (tok,) = engine.step([SeqInput(0, tokens, pos, routing_key=key)]).next_ids
        out.append(tok)
        pos += len(tokens)
        tokens = [tok]
    return out


@pytest.mark.parametrize("moe", [
    MoE(), MoE(moe_kernel="reference"), MoE(moe_kernel="batched"), MoE(expert_cache=2),
    MoE(routing_skew="affinity:0.1"),
    MoE(routing_skew="zipf:1.2", expert_cache=3, cache_policy="lfu"),
], ids=str)
def test_batched_decode_matches_one_request_at_a_time(moe):
    engine = LocalEngine.from_preset("tiny", kv_slots=4, device="cpu",
                                     dtype=torch.float64, seed=3, moe=moe)
    prompts = [[256, *b"hello"], [256, *b"a much longer prompt, to mix lengths"], [256, 7]]
    n = 12
    expected = [greedy_alone(engine, p, n, key) for key, p in enumerate(prompts)]

    # Continuous batching: requests join at different steps, prefill beside running decodes.
    joins = {0: 0, 1: 3, 2: 5}
    outs: dict[int, list[int]] = {i: [] for i in joins}
    for step in range(n + max(joins.values())):
        seqs, who = [], []
        for i, join in joins.items():
            if step < join or len(outs[i]) == n:
                continue
            if not outs[i]:
                seqs.append(SeqInput(i, prompts[i], 0, routing_key=i))
            else:
                position = len(prompts[i]) + len(outs[i]) - 1
                seqs.append(SeqInput(i, outs[i][-1:], position, routing_key=i))
            who.append(i)
        result = engine.step(seqs)
        toks, counts = result.next_ids, result.routed
        assert counts.shape == (PRESETS["tiny"].n_layers, PRESETS["tiny"].n_experts)
        for i, t in zip(who, toks, strict=True):
            outs[i].append(t)
    assert [outs[i] for i in joins] == expected


def test_seeded_sampling_repeats():
    engine = LocalEngine.from_preset("tiny", kv_slots=2, device="cpu", dtype=torch.float32, seed=0)

    def sample(seed):
        return engine.step([SeqInput(0, [256, 1, 2, 3], 0, temperature=1.0, seed=seed),
                            SeqInput(1, [256, 1, 2, 3], 0, temperature=1.0,
                                     seed=seed + 1)]).next_ids

    assert sample(5) == sample(5)


def test_chunked_prefill_beside_another_prefill_matches_whole_prefill():
    engine = LocalEngine.from_preset("tiny", kv_slots=2, device="cpu", dtype=torch.float64, seed=5)
    a = [256, *b"a long prompt that is prefilled in two chunks"]
    b = [256, *b"short"]
    n = 6
    expected = [greedy_alone(engine, p, n, key) for key, p in enumerate((a, b))]
    first = engine.step([SeqInput(0, a[:12], 0, routing_key=0), SeqInput(1, b, 0, routing_key=1)])
    assert first.tokens == 12 + len(b)
    outs = [[], [first.next_ids[1]]]  # a's first chunk yields no token yet
    second = engine.step([SeqInput(0, a[12:], 12, routing_key=0),
                          SeqInput(1, outs[1][-1:], len(b), routing_key=1)])
    outs[0].append(second.next_ids[0])
    outs[1].append(second.next_ids[1])
    while len(outs[0]) < n or len(outs[1]) < n:
        seqs = [SeqInput(i, outs[i][-1:], len(p) + len(outs[i]) - 1, routing_key=i)
                for i, p in enumerate((a, b)) if len(outs[i]) < n]
        who = [i for i in (0, 1) if len(outs[i]) < n]
        for i, tok in zip(who, engine.step(seqs).next_ids, strict=True):
            outs[i].append(tok)
    assert outs == expected


def test_prefill_padding_is_counted():
    engine = LocalEngine.from_preset("tiny", kv_slots=3, device="cpu", dtype=torch.float32, seed=0)
    result = engine.step([SeqInput(0, [1] * 10, 0), SeqInput(1, [2] * 4, 0), SeqInput(2, [3], 7)])
    # the 4-token prompt padded to 10
    assert (result.prefill_tokens, result.prefill_padded) == (14, 6)
    assert (result.kv_useful, result.kv_computed) == (8, 8)


@pytest.mark.slow
def test_gpu_check_runs_its_cpu_parts_and_says_what_it_skipped():
    done = subprocess.run([sys.executable, "-m", "server.tools.gpu_check", "--device", "cpu",
                           "--repeats", "2"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["failed"] == [] and results["build"]["torch"] == torch.__version__
    sorted_, batched, grouped = (results["host_transfers"][k]
                                 for k in ("sorted", "batched", "grouped_mm"))
    assert sorted_["counted"] == sorted_["budget"] == 1 + PRESETS["small"].n_layers
    assert batched["counted"] == sorted_["counted"]
    assert grouped.get("counted", 0) <= 1
    assert set(results["kernels"]) == {"small x32", "fine x8"}
    for case in results["kernels"].values():
        assert case["sorted_ms"] > 0 and case["batched_ms"] > 0 and case["batched_pads"]
    for part in ("fused_attention", "mixtral", "gpu_tests"):
        assert results[part]["skipped"].startswith("CUDA only")


@pytest.mark.parametrize(("start", "window"), [(0, 0), (5, 0), (0, 4), (5, 4), (5, 20)])
def test_causal_attention_equals_the_masked_reference(start, window):
    """New prompts (start 0) and a resumed one (its rows at the end of the keys), grouped
    query heads, with and without a sliding window the keys outgrow."""
    g = torch.Generator().manual_seed(start + window)
    t, s = 6, start + 6
    q = torch.randn(2, 4, t, 8, generator=g)
    k, v = torch.randn(2, 2, s, 8, generator=g), torch.randn(2, 2, s, 8, generator=g)
    rows, at = torch.arange(start, start + t)[:, None], torch.arange(s)[None, :]
    mask = (at <= rows) & ((at > rows - window) if window else True)
    expected = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1),
                                              v.repeat_interleave(2, 1), attn_mask=mask)
    torch.testing.assert_close(causal_attention(q, k, v, start, window), expected)
    if start or window:  # CUDA's way: the key heads repeated for the query heads first
        torch.testing.assert_close(masked_attention(q, k, v, mask, expand_heads=True), expected)


def test_an_engine_built_under_inference_mode_has_the_same_weights():
    # its experts are drawn on a pool of threads, which must take the caller's mode
    with torch.inference_mode():
        inside = LocalEngine.from_preset("tiny", kv_slots=1, device="cpu", dtype=torch.float32,
                                         seed=4)
    outside = LocalEngine.from_preset("tiny", kv_slots=1, device="cpu", dtype=torch.float32, seed=4)
    mine = dict(outside.model.named_parameters())
    for name, p in inside.model.named_parameters():
        assert torch.equal(p, mine[name]), name


def test_plain_cuda_is_the_current_gpu_by_its_index(monkeypatch):
    # torch.cuda.set_device refuses a device without one
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert indexed(torch.device("cuda")) == torch.device("cuda", 3)
    assert indexed(torch.device("cuda:1")) == torch.device("cuda", 1)
    assert indexed(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize("window", [0, 5])
def test_decode_over_the_pool_in_place_equals_decode_over_its_slots_gathered(window):
    """Three of four slots decoding attend over the pool in place (the idle slot's row
    dropped); the same step gathering its slots gives the same logits."""
    args = dataclasses.replace(PRESETS["tiny"], sliding_window=window)
    engine = LocalEngine(args, kv_slots=4, device="cpu", dtype=torch.float64, seed=2)
    engine.step([SeqInput(slot, [3 + slot] * (4 + 3 * slot), 0) for slot in (0, 1, 3)])
    seqs = [(3, 13, 1), (0, 4, 1), (1, 7, 1)]  # not in slot order
    logits, computed = [], []
    for pool in (4, 0):
        layout = StepLayout.build(seqs, engine.device, pool)
        engine.timer.begin()
        logits.append(engine.model(torch.tensor([7, 8, 9]), layout, engine.kv,
                                   StepContext(layout.groups, 3, engine.timer)))
        engine.timer.end()
        computed.append((layout.decode_pool, layout.kv_useful, layout.kv_computed))
    torch.testing.assert_close(logits[0], logits[1])
    assert computed == [(4, 14 + 5 + 8, 14 * 4), (0, 14 + 5 + 8, 14 * 3)]
