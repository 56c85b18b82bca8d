"""The engine's ranks on torch.distributed (docs/expert-parallelism.md).

Ranks are started either by `--ep N`, which spawns ranks 1..N-1 as copies of this server's
command line with torch.distributed's environment variables set, or by torchrun, which starts
every rank (rank 0 serves; the others follow it). The tensors MoE layers exchange go over the
default process group (gloo on a CPU, NCCL on CUDA); the commands rank 0 sends the others
each step, and the results it gathers, go over a gloo group, as Python objects.
"""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch import Tensor

ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# torch 2.13 renamed these; the old names remain (deprecated) for older torch
GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def launched() -> tuple[int, int] | None:
    """(rank, world size) when torchrun or rank 0 started this process as a rank."""
    if not all(name in os.environ for name in ENV):
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def spawn(world: int, argv: list[str]) -> tuple[list[subprocess.Popen], str]:
    """Starts ranks 1..world-1 of this command line on this machine; returns them and where
    rank 0 (this process) meets them."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world)}
    ranks = [subprocess.Popen([sys.executable, "-m", "server", *argv],
                              env=os.environ | common | {"RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(1, world)]
    return ranks, f"tcp://127.0.0.1:{port}"


class PendingExchange:
    """An exchange under way: its output, when it started, and how to wait for it."""

    def __init__(self, work: dist.Work, output: Tensor):
        self.work, self.output = work, output
        self.started_ns = time.perf_counter_ns()

    def wait(self, at_least_ms: float = 0.0) -> tuple[float, float]:
        """Blocks until the exchange is done and at least at_least_ms after it started (an
        emulated link); returns (ms from its start to now, ms this call blocked)."""
        begin = time.perf_counter_ns()
        self.work.wait()
        left_s = self.started_ns / 1e9 + at_least_ms / 1e3 - time.perf_counter_ns() / 1e9
        if left_s > 0:
            time.sleep(left_s)
        end = time.perf_counter_ns()
        return (end - self.started_ns) / 1e6, (end - begin) / 1e6


class EpGroup:
    def __init__(self, rank: int, world: int, timeout_s: float, device: torch.device,
                 init_method: str = "env://"):
        self.rank, self.world, self.device = rank, world, device
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank,
                                world_size=world, timeout=timeout, init_method=init_method)
        self.control = (dist.new_group(backend="gloo", timeout=timeout)
                        if device.type == "cuda" else dist.group.WORLD)

    # --- rank 0's commands and the others' results ---

    def command(self, command=None):
        """Rank 0 sends command to every rank; the others return the command sent."""
        box = [command]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def gather(self, obj) -> list | None:
        """Every rank's obj, in rank order, at rank 0 (None at the others)."""
        out = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.control)
        return out

    # --- the MoE layers' exchanges ---

    def all_gather(self, t: Tensor) -> Tensor:
        """Every rank's t, stacked in rank order [W, *t.shape]."""
        out = t.new_empty((self.world * t.shape[0], *t.shape[1:]))
        GATHER(out, t.contiguous())
        return out.view(self.world, *t.shape)

    def all_to_all(self, output: Tensor, t: Tensor, output_splits: list[int],
                   input_splits: list[int]) -> PendingExchange:
        """Rows of t to each rank (input_splits), rows from each into output (started)."""
        work = dist.all_to_all_single(output, t.contiguous(), output_split_sizes=output_splits,
                                      input_split_sizes=input_splits, async_op=True)
        return PendingExchange(work, output)

    def gather_rows(self, t: Tensor) -> PendingExchange:
        """Every rank's t [n, ...] (all the same n) into [W * n, ...] (started)."""
        output = t.new_empty((self.world * t.shape[0], *t.shape[1:]))
        return PendingExchange(GATHER(output, t.contiguous(), async_op=True),
                               output)

    def reduce_rows(self, t: Tensor) -> PendingExchange:
        """Sums t [W * n, ...] over the ranks; each rank gets its n rows (started)."""
        output = t.new_empty((t.shape[0] // self.world, *t.shape[1:]))
        return PendingExchange(REDUCE_SCATTER(output, t.contiguous(), async_op=True),
                               output)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
