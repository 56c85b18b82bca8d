"""The engine the settings describe (settings resolved by server/settings.py): in this process
(server/engine/local.py), or spread over the ranks of expert parallelism
(server/engine/distributed.py), the ranks spawned here unless torchrun started them; and the
life of a rank other than 0, which builds its share and follows rank 0."""

from __future__ import annotations

import logging
import subprocess

import torch

from server.engine.distributed import DistributedEngine, follow
from server.engine.interface import Engine
from server.engine.local import EngineOptions, LocalEngine
from server.engine.model_args import DTYPES
from server.parallel.exchange import ExpertSpread
from server.parallel.group import EpGroup, launched, spawn
from server.parallel.link import Link
from server.parallel.placement import Placement, balanced, contiguous
from server.settings import Startup

log = logging.getLogger(__name__)


def build_engine(startup: Startup) -> Engine:
    """The server's engine; the other ranks, if any, start with the command line as given."""
    ep = startup.settings.parallel.ep
    if ep == 1:
        return local_engine(startup, startup.settings.kv_slots)
    ranks, meet = ([], "env://") if launched() else spawn(ep, startup.argv)
    return distributed_engine(startup, ranks, meet)


def local_engine(startup: Startup, kv_slots: int, spread: ExpertSpread | None = None
                 ) -> LocalEngine:
    """The model in this process: the checkpoint's (--model) or the preset's shapes with random
    weights (--preset, --experts, --max-seq-len); with spread, this rank's share of the experts
    (the ranks warm up together)."""
    settings = startup.settings
    model = settings.model
    options = EngineOptions(moe=settings.moe, spread=spread, warm_up=spread is None,
                            checkpoint=startup.checkpoint,
                            graphs="auto" if model.cuda_graphs else "off",
                            sample_steps=model.gpu_sample_steps,
                            keep_routing=settings.serving.enable_return_routed_experts)
    return LocalEngine(startup.args, kv_slots, model.device, DTYPES[model.dtype], model.seed,
                       options)


def rank_engine(startup: Startup, rank: int, world: int, init_method: str = "env://"
                ) -> tuple[LocalEngine, EpGroup, Placement]:
    """This rank's engine, holding its share of the experts (balanced placement starts as if
    every expert had the same load), and the process group (joined first: every rank waits
    for all of them)."""
    model, p, args = startup.settings.model, startup.settings.parallel, startup.args
    group = EpGroup(rank, world, p.ep_timeout_s, torch.device(model.device), init_method)
    placement = (contiguous(args.n_layers, args.n_experts, world) if p.ep_placement == "contiguous"
                 else balanced(torch.ones(args.n_layers, args.n_experts), world, p.ep_redundant))
    link = Link(p.link_gbps, p.link_latency_us) if p.link_gbps else None
    spread = ExpertSpread(group, placement, p.ep_comm, p.ep_overlap == "two-batch", link,
                          p.link_emulate)
    engine = local_engine(startup, -(-startup.settings.kv_slots // world), spread)
    return engine, group, placement


def distributed_engine(startup: Startup, ranks: list[subprocess.Popen],
                       init_method: str = "env://") -> DistributedEngine:
    """Rank 0's engine over all the ranks (ranks: the processes this one started, if any, and
    init_method where it meets them)."""
    settings = startup.settings
    p = settings.parallel
    local, group, placement = rank_engine(startup, 0, p.ep, init_method)
    return DistributedEngine(local, group, settings.kv_slots, placement, p, ranks)


def follow_rank_0(startup: Startup) -> None:
    """The life of a rank other than 0: build its share, follow rank 0 until it says stop."""
    if startup.settings.model.torch_threads:
        torch.set_num_threads(startup.settings.model.torch_threads)
    rank, world = launched()
    engine, group, _ = rank_engine(startup, rank, world)
    log.info("rank %d of %d holds experts %s of layer 0", rank, world,
             engine.model.layers[0].moe.experts.held)
    try:
        follow(engine, group)
    finally:
        group.close()
