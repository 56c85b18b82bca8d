"""What the telemetry reads off the process and its GPU: CPU time, resident memory, and the
engine's GPU's utilisation and memory (where there is one)."""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import NamedTuple

import psutil
import torch

log = logging.getLogger(__name__)


def process_cpu_s() -> float:
    """User and system CPU seconds of this process, every thread's (the clock, not psutil: no
    /proc read on the event loop)."""
    return time.process_time()


@functools.cache
def this_process(pid: int) -> psutil.Process:
    """psutil's handle on a process, made once: making one reads /proc several times."""
    return psutil.Process(pid)


def process_rss_bytes() -> int:
    return this_process(os.getpid()).memory_info().rss


class GpuStats(NamedTuple):
    utilization_percent: float  # -1: unknown (no GPU, no NVML, or NVML cannot say)
    allocated_bytes: int  # held by tensors
    reserved_bytes: int  # held by torch's caching allocator, allocated or not


def gpu_stats(device: torch.device) -> GpuStats:
    """The engine's GPU; (-1, 0, 0) where there is none. NVML failing (not installed, or
    NotSupported under MIG: pynvml's errors are not RuntimeErrors) leaves the utilisation
    unknown and the rest of the telemetry served."""
    if device.type != "cuda":
        return GpuStats(-1.0, 0, 0)
    try:
        utilization = float(torch.cuda.utilization(device))
    except Exception as exc:  # pynvml.NVMLError and friends, whichever package provides them
        log_once(f"GPU utilisation unknown: NVML said {type(exc).__name__}: {exc}")
        utilization = -1.0
    return GpuStats(utilization, torch.cuda.memory_allocated(device),
                    torch.cuda.memory_reserved(device))


@functools.cache
def log_once(message: str) -> None:
    log.warning("%s", message)
