"""Which of a run's figures the load generator itself limited, and from when (summary.json's
`generator.limited`; docs/metrics.md, "When the generator is the limit").

A generator that falls behind spoils figures in two ways. Its sends go out late, or its event
loop wakes late: every receive time it stamps is that late (unless the kernel's receipt timed
the messages), so TTFT (and E2E) carry its delay, not the server's. Its reads fall behind the
stream: several events of one stream wait in the socket and come in one read, sharing a
timestamp, so the gaps between them read ~0, and ITL's low percentiles read a figure that is
wrong rather than late. Each is counted by the second of the run it happened in (from its
start: each process its own), so the summary can say from when; the counts add up across
processes.
"""

from __future__ import annotations

from collections import Counter

COALESCED_US = 20  # a gap between two events of one stream under this: one read held both
SHARE = 0.01  # more than this share of a second's gaps (or sends, or loop wakes): limited
LATE_US = 5_000  # a send, or a wake of the loop, later than this is the generator's delay
MIN_SAMPLES = 20  # fewer gaps (sends, wakes) than this say nothing
MIN_LIMITED = 5  # nor fewer late ones (one late send of a short run's 80 is not a limit)
# figure -> the figures it spoils (summary.json's metrics)
SPOILS = {"ttft": ("ttft", "ttft_service", "e2e", "e2e_service", "delivery_lag"),
          "itl": ("itl", "itl_token")}


class GeneratorLimits:
    def __init__(self):
        self.seconds: dict[int, Counter] = {}  # second of the run -> its counts

    def _at(self, second: int) -> Counter:
        return self.seconds.setdefault(max(0, second), Counter())

    def gaps(self, second: int, gaps_us: list[int]) -> None:
        """A measured stream's gaps between events, at the second it ended."""
        if gaps_us:
            self._at(second).update(gaps=len(gaps_us),
                                    coalesced=sum(1 for gap in gaps_us if gap < COALESCED_US))

    def send(self, second: int, lag_us: int) -> None:
        self._at(second).update(sends=1, late_sends=lag_us > LATE_US)

    def wake(self, second: int, late_us: int) -> None:
        """One wake of the event-loop probe, late_us late."""
        self._at(second).update(wakes=1, late_wakes=late_us > LATE_US)

    def export(self) -> dict[str, dict[str, int]]:
        return {str(second): dict(counts) for second, counts in self.seconds.items()}

    def absorb(self, part: dict[str, dict[str, int]]) -> None:
        for second, counts in part.items():
            self.seconds.setdefault(int(second), Counter()).update(counts)

    def first(self, many: str, of: str) -> tuple[int, float] | None:
        """Where more than SHARE of the run's `of` (at least MIN_SAMPLES, MIN_LIMITED of them
        `many`) were `many`: the first second with one from which on the share stayed above
        SHARE, and the share from then; None where the run's share is not above it."""
        found, many_after, of_after = None, 0, 0
        for second in sorted(self.seconds, reverse=True):  # the totals from each second on
            counts = self.seconds[second]
            many_after, of_after = many_after + counts[many], of_after + counts[of]
            if counts[many] and many_after > SHARE * of_after:
                found = second, many_after / of_after
        if (of_after < MIN_SAMPLES or many_after < MIN_LIMITED
                or many_after <= SHARE * of_after):
            return None
        return found

    def limited(self, kernel_timed: bool = False) -> dict[str, str]:
        """figure ("ttft", "itl") -> why and from when the generator limited it. kernel_timed:
        the messages were timed by the kernel's receipt (docs/metrics.md, "Arrival times"), so
        a late loop delayed only the sends, which the late sends count."""
        why: dict[str, list[tuple[int, str]]] = {}
        late_ms = LATE_US / 1000
        if found := self.first("late_sends", "sends"):
            why.setdefault("ttft", []).append(
                (found[0], f"{found[1]:.1%} of its sends went out over {late_ms:g} ms late"))
        if not kernel_timed and (found := self.first("late_wakes", "wakes")):
            for figure in SPOILS:
                why.setdefault(figure, []).append(
                    (found[0], f"its event loop woke over {late_ms:g} ms late "
                               f"{found[1]:.1%} of the time, and its timestamps with it"))
        if found := self.first("coalesced", "gaps"):
            why.setdefault("itl", []).append(
                (found[0], f"{found[1]:.1%} of the gaps between a stream's events were under "
                           f"{COALESCED_US} us: events read together, behind the stream"))
        return {figure: f"from {min(s for s, _ in reasons)} s of the run: "
                        + "; ".join(text for _, text in reasons)
                for figure, reasons in why.items()}
