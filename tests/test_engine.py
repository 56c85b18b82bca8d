"""The engine computes what the plain definitions say: the sorted-expert MoE layer equals a
per-token reference, and batched continuous-batching decode equals one request at a time."""

import torch

from server.engine import Engine, SeqInput
from server.model import PRESETS, MoEFeedForward, Transformer


def greedy_alone(engine: Engine, prompt: list[int], n: int) -> list[int]:
    out = []
    tokens, pos = prompt, 0
    for _ in range(n):
        (tok,), _ = engine.step([SeqInput(0, tokens, pos)])
        out.append(tok)
        pos += len(tokens)
        tokens = [tok]
    return out


def test_sorted_moe_matches_per_token_reference():
    torch.manual_seed(0)
    model = Transformer(PRESETS["tiny"], dtype=torch.float64)
    model.init_random(1)
    moe: MoEFeedForward = model.layers[0].moe
    x = torch.randn(37, PRESETS["tiny"].dim, dtype=torch.float64)
    y, counts = moe(x)
    torch.testing.assert_close(y, moe.reference(x))
    assert counts.sum().item() == 37 * PRESETS["tiny"].top_k


def test_batched_decode_matches_one_request_at_a_time():
    engine = Engine("tiny", kv_slots=4, device="cpu", dtype=torch.float64, seed=3)
    prompts = [[256, *b"hello"], [256, *b"a much longer prompt, to mix lengths"], [256, 7]]
    n = 12
    expected = [greedy_alone(engine, p, n) for p in prompts]

    # Continuous batching: requests join at different steps, prefill beside running decodes.
    joins = {0: 0, 1: 3, 2: 5}
    outs: dict[int, list[int]] = {i: [] for i in joins}
    for step in range(n + max(joins.values())):
        seqs, who = [], []
        for i, join in joins.items():
            if step < join or len(outs[i]) == n:
                continue
            if not outs[i]:
                seqs.append(SeqInput(i, prompts[i], 0))
            else:
                seqs.append(SeqInput(i, outs[i][-1:], len(prompts[i]) + len(outs[i]) - 1))
            who.append(i)
        toks, counts = engine.step(seqs)
        assert counts.shape == (PRESETS["tiny"].n_layers, PRESETS["tiny"].n_experts)
        for i, t in zip(who, toks, strict=True):
            outs[i].append(t)
    assert [outs[i] for i in joins] == expected


def test_seeded_sampling_repeats():
    engine = Engine("tiny", kv_slots=2, device="cpu", dtype=torch.float32, seed=0)

    def sample(seed):
        gen = engine.new_generator(seed)
        toks, _ = engine.step([SeqInput(0, [256, 1, 2, 3], 0, 1.0, gen),
                               SeqInput(1, [256, 1, 2, 3], 0, 1.0, engine.new_generator(seed + 1))])
        return toks

    assert sample(5) == sample(5)
