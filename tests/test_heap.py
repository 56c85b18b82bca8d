"""The heap trimmer: glibc's malloc_trim is found here, called between steps only once its
interval has passed, never with interval 0; and a trim gives the pages of freed chunks back
(RSS falls) while the memory in use stays; a server counts its trims in GetStats and /metrics."""

import ctypes

import psutil

from proto import moe_pb2
from server.scheduling.heap import HeapTrimmer, malloc_trim
from tests.conftest import running_server
from tests.test_telemetry import scrape


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_it_trims_once_its_interval_has_passed():
    clock = Clock()
    heap = HeapTrimmer(10.0, clock)
    assert heap.trim is not None  # glibc
    clock.now = 9.9
    assert not heap.maybe_trim() and heap.trims == 0
    clock.now = 10.0
    assert heap.maybe_trim() and heap.trims == 1 and heap.trim_ms > 0
    assert not heap.maybe_trim()  # the interval starts again
    never = HeapTrimmer(0, clock)
    clock.now = 1e9
    assert never.trim is None and not never.maybe_trim()


def test_a_trim_returns_freed_chunks_that_shrinking_the_heap_cannot():
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    rss = psutil.Process().memory_info
    # 200 MB of 64 KB chunks (under the mmap threshold: inside the heap), touched, then every
    # one freed but the last: the heap's top stays in use, so only a trim releases the rest
    chunks = [libc.malloc(64 * 1024) for _ in range(3200)]
    for c in chunks:
        ctypes.memset(c, 1, 64 * 1024)
    for c in chunks[:-1]:
        libc.free(c)
    before = rss().rss
    malloc_trim()(0)
    released = before - rss().rss
    libc.free(chunks[-1])
    assert released > 100 * 2**20


def test_a_server_counts_its_trims_in_getstats_and_metrics():
    with running_server(heap_trim_s=0.001, metrics_port=0) as served:
        list(served.stub.Generate(moe_pb2.GenerateRequest(prompt="trim", max_tokens=8,
                                                          ignore_eos=True)))
        stats = served.stub.GetStats(moe_pb2.GetStatsRequest())
        scraped = scrape(served.app.metrics_port)
    assert stats.heap_trims >= 1 and stats.heap_trim_ms > 0  # a step takes over 1 ms
    assert scraped[("moe_heap_trims_total", ())] >= stats.heap_trims
    assert scraped[("moe_heap_trim_seconds_total", ())] > 0
