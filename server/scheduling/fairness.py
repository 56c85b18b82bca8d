"""Fair admission across clients: the order in which every batching policy sees the wait
queue."""

from __future__ import annotations

import collections
from collections.abc import Sequence

from server.scheduling.requests import Request


def fair_order(waiting: collections.deque[Request],
               resident: Sequence[Request] = ()) -> Sequence[Request]:
    """The wait queue as every policy sees it: clients holding the fewest places go first.
    A client's k-th waiting request ranks as if it held its resident requests plus k places;
    ties go to the older request. One client's thousand requests therefore do not all go before
    another's first, and a client already running many yields to one running none. Arrival
    order when one client waits."""
    if not waiting or all(r.client == waiting[0].client for r in waiting):
        return waiting
    held = collections.Counter(r.client for r in resident)
    ranks = []
    for req in waiting:
        ranks.append(held[req.client])
        held[req.client] += 1
    order = sorted(range(len(waiting)), key=lambda i: (ranks[i], waiting[i].received_ns))
    return [waiting[i] for i in order]
