"""Giving freed heap memory back to the system.

glibc's malloc keeps the pages of freed chunks inside its arenas for reuse. Under requests of
varied sizes (prompts and batches change every step) the free space grows in holes it cannot
release by shrinking the heap from the top, so the process's RSS creeps up while the memory
in use stays flat. Measured on the lab server (docs/measured.md): RSS rose 31.8 MB/h in a
20-minute soak, with glibc's arenas growing 34.1 MB/h and the bytes in use changing by
-3.6 MB/h. `malloc_trim(0)` hands the free pages back (madvise); the engine thread calls it
between steps every --heap-trim-s seconds. Elsewhere (musl, macOS) there is no such call and
nothing is done.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


class HeapTrimmer:
    """Trims the heap when interval_s has passed since the last trim; interval 0: never."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic):
        self.trim = malloc_trim() if interval_s > 0 else None
        self.interval_s = interval_s
        self.clock = clock
        self.last = clock()
        self.trims = 0
        self.trim_ms = 0.0  # time spent trimming, summed

    def maybe_trim(self) -> bool:
        if self.trim is None or self.clock() - self.last < self.interval_s:
            return False
        start = time.perf_counter_ns()
        self.trim(0)
        self.trim_ms += (time.perf_counter_ns() - start) / 1e6
        self.trims += 1
        self.last = self.clock()
        return True
