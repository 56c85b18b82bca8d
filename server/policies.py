"""Batching policies: each step, which waiting requests join the running batch.

A policy sees the wait queue (oldest first) and how many requests may join now (bounded by
free KV slots and batch places); it returns the ones to admit. Running requests always
decode. The scheduler and the engine never ask which policy runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol


class Policy(Protocol):
    name: str

    def select(self, waiting: Sequence, capacity: int) -> list:
        """Requests to admit this step, at most capacity of them, taken from waiting."""


class FcfsPolicy:
    """Admit in arrival order while KV slots and batch places allow: the baseline."""

    name = "fcfs"

    def select(self, waiting: Sequence, capacity: int) -> list:
        return list(itertools.islice(waiting, capacity))


POLICIES: dict[str, type] = {"fcfs": FcfsPolicy}
