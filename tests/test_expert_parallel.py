"""Expert parallelism (--ep): placements (contiguous, balanced with replicas) and the link
model as plain functions; then real ranks on gloo, tiny preset, one torch thread each: greedy
output equal to --ep 1 for every batching policy and every way of spreading the experts, the
bytes reported equal to the routing the step log records, a rank killed or hung failing its
requests UNAVAILABLE by name and stopping the server, SIGTERM stopping every rank, torchrun
starting the ranks, and the settings --ep refuses."""

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import psutil
import pytest
import torch

from proto import moe_pb2, moe_pb2_grpc
from records.declare import SettingsError, build
from records.server_settings import ServerSettings
from server.parallel.link import Link
from server.parallel.placement import balanced, contiguous, imbalance, rank_loads
from server.scheduling.policies import POLICIES
from server.settings import prepare
from tests.conftest import REPO, running_server, server_process, stop_process

PROMPTS = ["hello experts", "a", "mixture of experts at scale", "xyz", "q", "the end"]


def test_contiguous_placement_gives_each_rank_a_run_of_experts():
    p = contiguous(n_layers=2, n_experts=8, world=4)
    assert p.held[1] == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert p.replicas(0)[5] == [(2, 1)]
    with pytest.raises(ValueError, match="8 experts do not divide over 3 ranks"):
        contiguous(1, 8, 3)


def test_balanced_placement_replicates_the_hottest_and_evens_the_ranks():
    load = torch.tensor([[100.0, 1, 1, 1, 1, 1, 1, 50]])
    p = balanced(load, world=2, redundant=2)
    held = p.held[0]
    assert all(len(rank) == 5 for rank in held) and all(len(set(r)) == len(r) for r in held)
    assert [len(r) for r in p.replicas(0)] == [2, 1, 1, 1, 1, 1, 1, 2]  # 0 and 7 replicated
    even = imbalance(rank_loads(p, 0, load[0].tolist()))
    plain = imbalance(rank_loads(contiguous(1, 8, 2), 0, load[0].tolist()))
    assert even < 1.01 < 1.3 < plain


def test_the_link_model_waits_for_the_slowest_pair():
    link = Link(gbps=8, latency_us=10)  # 1 GB/s
    assert link.ms([[5_000_000, 0], [1_000_000, 0]]) == pytest.approx(0.01 + 1.0)
    assert link.ms([[9, 0], [0, 9]]) == 0.0  # a rank's bytes to itself never cross


def generate(served, prompts=PROMPTS, max_tokens=10) -> list[list[int]]:
    """The prompts sent at once (so they batch), each's greedy tokens."""
    out = {}

    def ask(i):
        out[i] = [t for m in served.stub.Generate(moe_pb2.GenerateRequest(
            prompt=prompts[i], max_tokens=max_tokens, ignore_eos=True)) for t in m.token_ids]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return [out[i] for i in range(len(prompts))]


@pytest.mark.slow
@pytest.mark.parametrize("policy", list(POLICIES))
def test_two_ranks_generate_what_one_does_under_every_policy(policy):
    knobs = {"policy": policy, "max_batch_size": 4, "max_wait_ms": 20, "max_step_tokens": 24}
    with running_server(**knobs) as one:
        expected = generate(one)
    with running_server(ep=2, **knobs) as two:
        assert generate(two) == expected


@pytest.mark.slow
@pytest.mark.parametrize("spread", [
    {"ep": 4},
    {"ep": 2, "ep_comm": "allgather-reducescatter"},
    {"ep": 2, "ep_overlap": "two-batch"},
    {"ep": 2, "ep_placement": "balanced", "ep_redundant": 2, "ep_rebalance_steps": 3},
    {"ep": 2, "link_gbps": 10.0, "link_latency_us": 100.0, "link_emulate": True},
], ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_every_way_of_spreading_the_experts_generates_what_one_rank_does(spread):
    with running_server(max_batch_size=4) as one:
        expected = generate(one)
    with running_server(max_batch_size=4, **spread) as many:
        assert generate(many) == expected
        stats = many.stub.GetStats(moe_pb2.GetStatsRequest()).expert_parallel
    assert stats.ranks == spread["ep"] and stats.exchanges > 0
    assert sum(p.dispatch_bytes for p in stats.pairs) > 0
    if spread.get("link_emulate"):  # each exchange lasted its modelled time at least
        assert stats.dispatch_exposed_ms >= 0.9 * stats.dispatch_modelled_ms > 0
    if spread.get("ep_placement") == "balanced":
        assert stats.placements >= 1


@pytest.mark.slow
def test_the_bytes_reported_are_the_routing_s(tmp_path):
    log = tmp_path / "steps.jsonl"
    with running_server(ep=2, max_batch_size=4, step_log=str(log)) as served:
        generate(served)
        stats = served.stub.GetStats(moe_pb2.GetStatsRequest())
    d, element = 64, 4  # tiny: D 64, float32
    totals = {}
    owner = [e // 2 for e in range(4)]  # contiguous: experts 0-1 on rank 0, 2-3 on rank 1
    for line in log.read_text().splitlines():
        step = json.loads(line)
        for layer, x in enumerate(step["exchanges"]):
            expected = [[0, 0], [0, 0]]
            for source, routed in enumerate(step["routed_by_rank"]):
                for e, n in enumerate(routed[layer]):
                    if owner[e] != source:
                        expected[source][owner[e]] += n * d * element
            assert x["dispatch_bytes"] == expected
            assert x["combine_bytes"] == [list(col) for col in zip(*expected, strict=True)]
            for s in range(2):
                for r in range(2):
                    totals[s, r] = totals.get((s, r), 0) + expected[s][r]
    reported = {(p.source, p.destination): p.dispatch_bytes for p in stats.expert_parallel.pairs}
    assert reported == {k: v for k, v in totals.items() if k[0] != k[1]}
    assert [len(layer.rank_pairs) for layer in stats.layers] == [2, 2]


def rank_processes(server: subprocess.Popen) -> list[psutil.Process]:
    return [p for p in psutil.Process(server.pid).children()
            if "server" in " ".join(p.cmdline())]


def health(port: int) -> str:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                          timeout=5)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_lost_rank_fails_its_requests_by_name_and_stops_the_server(tmp_path, how):
    with server_process(tmp_path, "--ep", "2", "--ep-timeout-s", "3") as (proc, port):
        stub = moe_pb2_grpc.MoEInferenceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        list(stub.Generate(moe_pb2.GenerateRequest(prompt="ok", max_tokens=2)))
        (rank,) = rank_processes(proc)
        rank.kill() if how == "killed" else rank.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Generate(moe_pb2.GenerateRequest(prompt="gone", max_tokens=4),
                               timeout=30))
        failed_after_s = time.monotonic() - started
        code = proc.wait(timeout=30)
        with contextlib.suppress(psutil.NoSuchProcess):  # rank 0 ends a rank that hangs on
            rank.kill()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "expert-parallel step failed" in err.value.details()
    if how == "killed":
        assert "rank 1 exited" in err.value.details()
    else:
        assert failed_after_s < 20  # the collective timed out (--ep-timeout-s), no hang
    assert code != 0
    assert "a rank of the expert-parallel engine failed" in (tmp_path / "server.log").read_text()


@pytest.mark.slow
def test_sigterm_stops_every_rank(tmp_path):
    with server_process(tmp_path, "--ep", "2") as (proc, port):
        ranks = rank_processes(proc)
        stub = moe_pb2_grpc.MoEInferenceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        list(stub.Generate(moe_pb2.GenerateRequest(prompt="ok", max_tokens=2)))
        assert health(port) == "SERVING"
        assert stop_process(proc) == 0
    assert ranks and not any(r.is_running() and r.status() != psutil.STATUS_ZOMBIE
                             for r in ranks)


@pytest.mark.slow
def test_torchrun_starts_the_ranks(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        master = s.getsockname()[1]
    port_file = tmp_path / "port"
    torchrun = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(master), "-m", "server",
         "--ep", "2", "--preset", "tiny", "--torch-threads", "1", "--dtype", "float32",
         "--device", "cpu",
         "--port", "0", "--port-file", str(port_file)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while not port_file.exists() and time.monotonic() < deadline:
            assert torchrun.poll() is None, torchrun.stdout.read()
            time.sleep(0.1)
        port = int(port_file.read_text())
        stub = moe_pb2_grpc.MoEInferenceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        tokens = [t for m in stub.Generate(moe_pb2.GenerateRequest(
            prompt="hello", max_tokens=4, ignore_eos=True)) for t in m.token_ids]
        stats = stub.GetStats(moe_pb2.GetStatsRequest()).expert_parallel
    finally:
        stop_process(torchrun)
    assert len(tokens) == 4 and stats.ranks == 2 and stats.exchanges > 0


@pytest.mark.parametrize("values, message", [
    ({"ep": 3}, "--ep: 4 experts do not divide over 3 ranks"),
    ({"ep": 2, "ep_placement": "balanced", "ep_redundant": 1},
     "--ep: 4 experts \\+ 1 replicas do not divide over 2 ranks"),
    ({"ep": 2, "ep_redundant": 2}, "--ep-redundant: replicas come with --ep-placement balanced"),
    ({"ep": 2, "ep_overlap": "two-batch", "ep_comm": "allgather-reducescatter"},
     "--ep-overlap: two-batch overlaps the all-to-all"),
    ({"ep": 2, "router": "noisy_topk"}, "--router: .*only topk"),
    ({"ep": 2, "expert_cache": 2}, "--expert-cache: not supported with --ep"),
    ({"ep": 2, "capacity_factor": 1.0}, "--capacity-factor: .*not supported with --ep"),
    ({"ep_placement": "balanced"}, "--ep-placement: .*needs --ep 2 or more"),
    ({"link_emulate": True}, "--link-emulate: needs --link-gbps"),
])
def test_settings_expert_parallelism_refuses(values, message):
    with pytest.raises(SettingsError, match=message):
        prepare(build(ServerSettings, {"preset": "tiny", "port": 0} | values), ports=False)


def ep_snapshot(uptime_s: float, bytes_each: int, exposed_ms: float, step_ms: float,
                tokens: int, rank_pairs: list[list[int]]) -> dict:
    """A GetStats snapshot (JSON) of a 2-rank server: each direction between the two ranks
    moved bytes_each per phase."""
    pairs = [{"source": s, "destination": 1 - s, "dispatch_bytes": bytes_each,
              "combine_bytes": bytes_each} for s in (0, 1)]
    return {"uptime_s": uptime_s, "window_s": uptime_s, "steps": 100, "num_layers": 2,
            "num_experts": 4, "top_k": 2, "hidden_size": 64,
            "settings": {"dtype": "float32", "ep_comm": "all-to-all",
                         "ep_placement": "contiguous", "ep_overlap": "none",
                         "link_gbps": "1.0", "link_latency_us": "10.0"},
            "step_ms": {"count": 100, "sum": step_ms},
            "tokens_per_step": {"count": 100, "sum": tokens},
            "layers": [{"expert_tokens": [1, 1, 1, 1], "rank_pairs": row} for row in rank_pairs],
            "expert_parallel": {"ranks": 2, "pairs": pairs, "dispatch_ms": 2 * exposed_ms,
                                "combine_ms": 2 * exposed_ms, "dispatch_exposed_ms": exposed_ms,
                                "combine_exposed_ms": exposed_ms, "exchanges": 200}}


@pytest.mark.parametrize("exposed_ms, fired", [(50.0, False), (300.0, True)])
def test_the_communication_rule_answers_whether_the_exchanges_saturate(exposed_ms, fired):
    from analysis.rules.expert_parallel import communication, ep_view
    from tests.rundirs import snapshots

    server = snapshots(ep_snapshot(1.0, 0, 0.0, 0.0, 0, [[0, 0], [0, 0]]),
                       ep_snapshot(11.0, 1_000_000, exposed_ms, 1000.0, 1000,
                                   [[900, 1100], [1000, 1000]]))
    view = ep_view(server)
    assert view.total_bytes == 4_000_000 and view.window_s == 10.0
    # 1000 tokens x k 2 x D 64 x 4 bytes x 1/2 x 2 layers
    assert view.formula_bytes == 512_000
    assert view.rank_imbalance == pytest.approx(1100 / 1000)
    assert view.link_utilisation == pytest.approx(2_000_000 * 8 / (1e9 * 10))
    finding = communication(server)
    assert finding.fired is fired and finding.judged
    assert ("saturated: the steps waited 60.0%" in finding.verdict if fired
            else "10.0% exposed" in finding.verdict)


def test_one_rank_is_not_judged_for_communication():
    from analysis.rules.expert_parallel import communication
    from tests.rundirs import snapshots

    finding = communication(snapshots({"uptime_s": 1.0, "steps": 1}, None))
    assert not finding.judged and "one rank" in finding.verdict


def test_capacity_sizes_each_rank_for_the_busiest():
    import numpy as np

    from analysis.capacity import ExpertLoads, plan, rank_line

    routed = np.full((1, 2, 4), 50.0)  # one interval: 100 steps x 1 token x k 2 over 4 experts
    load = ExpertLoads(2, 4, np.array([100.0]), routed, np.zeros_like(routed), 0.0, "test",
                       rank_pairs=np.array([[80.0, 120.0], [100.0, 100.0]]))
    line = rank_line(plan(load, 0.5, [1.0], True))
    assert "over 2 ranks: a rank's experts computed 1.00 pairs per step" in line
    assert "rank 1 in layer 0, 1.20 (1.20x)" in line and "capacity for 2.40 pairs" in line


def test_the_sweep_table_puts_the_seed_s_figures_beside_each_expert_count(tmp_path):
    from analysis.sweep import overlap_effects, row_of, table
    from tests.rundirs import write_summary

    def run(name, experts, overlap, tokens_per_s, tpot_ms):
        end = ep_snapshot(11.0, 1000, 10.0, 1000.0, 1000, [[1, 1], [1, 1]])
        end |= {"num_experts": experts,
                "settings": end["settings"] | {"ep_overlap": overlap}}
        write_summary(tmp_path / name, server={"end": end},
                      metrics={"tpot_ms": {"count": 5, "mean": tpot_ms, "p99": tpot_ms}},
                      throughput={"window_s": 25.0, "output_tokens_per_s": tokens_per_s,
                                  "requests_per_s": 1.0, "goodput_requests_per_s": 1.0})
        (tmp_path / name / "histograms.json").write_text("{}")
        return row_of(tmp_path / name)

    rows = [run("a", 16, "none", 100.0, 50.0), run("b", 16, "two-batch", 120.0, 40.0)]
    printed = table(rows)
    assert printed.splitlines()[1].split()[:3] == ["16", "none", "100.0"]
    assert printed.splitlines()[1].split()[-3:] == ["2100", "38", "75"]  # the seed's row
    (effect,) = overlap_effects(rows)
    assert "throughput +20% (seed +27%)" in effect and "TPOT mean -20%" in effect


@pytest.mark.slow
@pytest.mark.parametrize("family, fused", [("qwen3_moe", False), ("mixtral", True)])
def test_a_checkpoint_spread_over_ranks_generates_what_one_rank_does(tmp_path, family, fused):
    # each rank loads only its experts; balanced re-placement reads new ones from the files
    pytest.importorskip("transformers")
    from tests.checkpoints import write_checkpoint

    write_checkpoint(tmp_path, family, fused=fused)
    with running_server(checkpoint=str(tmp_path), max_batch_size=4) as one:
        expected = generate(one)
    with running_server(checkpoint=str(tmp_path), max_batch_size=4, ep=2,
                        ep_placement="balanced", ep_redundant=2, ep_rebalance_steps=2) as two:
        assert generate(two) == expected
        assert two.stub.GetStats(moe_pb2.GetStatsRequest()).expert_parallel.experts_moved > 0
