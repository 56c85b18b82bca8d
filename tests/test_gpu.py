"""On CUDA (skipped, with the reason, where there is none): a seed builds the same weights on
the GPU as on the CPU; a server on the GPU streams, and GetStats reports the memory torch holds
(reserved at least allocated) and a utilisation that is a percentage or unknown; stage times
recorded on the server's own GPU (the second, where there are two) fit inside its steps, and so
does the GPU's busy time; experts kept in host memory for the expert cache are pinned; an engine
step waits for the GPU only at its counted reads; decode steps replayed as CUDA graphs give the
eager steps' tokens and wait once."""

import gc

import pytest
import torch

from proto import moe_pb2
from records.server_settings import MoE
from server.engine.host_transfer import cuda_waits
from server.engine.interface import SeqInput
from server.engine.local import LocalEngine
from server.engine.model import Transformer
from server.engine.model_args import PRESETS
from server.engine.moe import Experts
from tests.conftest import running_server

pytestmark = pytest.mark.gpu


def test_a_seed_builds_the_same_weights_on_the_gpu():
    cpu = Transformer(PRESETS["tiny"], MoE(), 5, "cpu", torch.float32)
    gpu = Transformer(PRESETS["tiny"], MoE(), 5, "cuda", torch.float32)
    cpu.init_random(5)
    gpu.init_random(5)
    mine = dict(gpu.named_parameters())
    for name, p in cpu.named_parameters():
        assert torch.equal(p, mine[name].cpu()), name


@pytest.mark.parametrize("index", [0, 1])
def test_a_server_on_a_gpu_streams_and_reports_its_memory(index):
    if index >= torch.cuda.device_count():
        pytest.skip(f"needs {index + 1} GPUs")
    with running_server(device=f"cuda:{index}", gpu_sample_steps=2) as served:
        msgs = list(served.stub.Generate(moe_pb2.GenerateRequest(prompt="hello", max_tokens=8,
                                                                 ignore_eos=True)))
        assert sum(len(m.token_ids) for m in msgs) == 8
        stats = served.stub.GetStats(moe_pb2.GetStatsRequest())
    assert stats.gpu_memory_reserved_bytes >= stats.gpu_memory_bytes > 0
    assert stats.gpu_utilization_percent == -1 or 0 <= stats.gpu_utilization_percent <= 100
    # sampled steps' stages, GPU work timed by events on that GPU's stream, fit inside the steps'
    # wall time; graph steps' GPU busy inside theirs
    stage_ms = sum(s.ms.sum for s in stats.stages)
    assert 0 < stage_ms <= 1.05 * stats.step_ms.sum
    assert 0 < stats.gpu_busy_ms <= stats.gpu_timed_ms and stats.gpu_timed_steps > 0


def test_experts_kept_in_host_memory_are_pinned_at_their_own_size():
    for _ in range(3):  # each unpinned as it goes: memory handed out again pins again
        experts = Experts(PRESETS["tiny"], "cuda", torch.bfloat16, on_host=True)
        for w in experts.weights:
            assert w.device.type == "cpu" and w.is_pinned()
        del experts, w
        gc.collect()


@pytest.mark.parametrize("kernel", ["sorted", "batched", "grouped_mm"])
def test_a_step_waits_for_the_gpu_only_at_its_counted_reads(kernel):
    engine = LocalEngine.from_preset("small", 4, "cuda", torch.bfloat16, 0,
                                     moe=MoE(moe_kernel=kernel))
    if engine.kernel_name != kernel:
        pytest.skip(f"{kernel} falls back to {engine.kernel_name} here")
    engine.step([SeqInput(0, [1] * 7, 0), SeqInput(1, [2] * 3, 0)])
    torch.cuda.synchronize()
    result, waits = cuda_waits(lambda: engine.step([
        SeqInput(0, [5], 7, temperature=0.8),  # decode
        SeqInput(1, [6] * 4, 3),  # resumed: masked attention
        SeqInput(2, [1] * 4, 0)]))  # new
    assert len(waits) <= result.host_transfers, waits


def greedy_decode(engine: LocalEngine, steps: int) -> list[list[int]]:
    prompts = [[1 + i] * (5 + 3 * i) for i in range(5)]
    first = engine.step([SeqInput(i, p, 0) for i, p in enumerate(prompts)])
    tokens = [[t] for t in first.next_ids]
    for _ in range(steps):
        seqs = [SeqInput(i, [t[-1]], len(p) + len(t) - 1)
                for i, (p, t) in enumerate(zip(prompts, tokens, strict=True))]
        for t, n in zip(tokens, engine.step(seqs).next_ids, strict=True):
            t.append(n)
    return tokens


def test_decode_graphs_give_the_eager_tokens_and_wait_once():
    # one kernel for both: auto's start-up timing could pick others for their eager steps
    moe = MoE(moe_kernel="grouped_mm")
    graphed = LocalEngine.from_preset("small", 8, "cuda", torch.bfloat16, 0, moe=moe)
    if graphed.graphs is None:
        pytest.skip("decode graphs cannot run here (the log says why)")
    eager = LocalEngine.from_preset("small", 8, "cuda", torch.bfloat16, 0, moe=moe,
                                    graphs="off")
    assert greedy_decode(graphed, 24) == greedy_decode(eager, 24)
    seqs = [SeqInput(i, [3], 40) for i in range(5)]  # 5 rows: bucket 8
    torch.cuda.synchronize()
    result, waits = cuda_waits(lambda: graphed.step(seqs))
    assert result.host_transfers == 1 and len(waits) <= 1, waits
