"""The heap trimmer: glibc's malloc_trim is found here, called between steps only once its
interval has passed, never with interval 0; and a trim gives the pages of freed chunks back
(RSS falls) while the memory in use stays."""

import ctypes

import psutil

from server.heap import HeapTrimmer, malloc_trim


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
