"""Scrapes of a server's Prometheus endpoint as the load generator writes them: each line of
server_metrics.jsonl is one scrape of one source (a `/metrics` URL, or `nvml`, the GPUs of the
load generator's host), every family it held as parsed (name, type, help, each sample with its
labels), so a family nobody maps is still there for a later analysis. A scrape that failed holds
why; one the caps cut says what they left out (docs/run-directory.md)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from records.jsonform import field

NVML = "nvml"  # the source name of the load generator's own GPUs (loadgen/scraping/nvml.py)
MAX_SCRAPE_BYTES = 8 << 20  # a body above this is not parsed: the scrape fails, saying so
MAX_FAMILIES = 2000  # families kept of one scrape, in the order the server wrote them
MAX_SAMPLES = 20_000  # samples kept of one scrape, over all its families


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One sample: its full name (a histogram's `_bucket`, `_sum`, `_count`), labels, value
    (None where the server wrote NaN or an infinity)."""

    name: str
    labels: dict[str, str] = field(default_factory=dict, omit={})
    value: float | None


@dataclass(frozen=True, kw_only=True)
class Family:
    """A metric family as the parser read it: a counter's name without `_total`."""

    name: str
    type: str  # counter, gauge, histogram, summary, info, stateset, gaugehistogram, unknown
    help: str = field("", omit="")
    samples: list[Sample] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Scrape:
    """A line of server_metrics.jsonl: one source at one time, on the load generator's clock."""

    t_unix_s: float
    t_run_s: float  # seconds after the run started
    source: str  # the URL scraped, or "nvml"
    ok: bool
    error: str = field("", omit="")  # why it failed, in a few words (a failed scrape)
    elapsed_ms: float = 0.0  # from the request to the parsed body
    bytes: int = 0  # of the body read
    cut: str = field("", omit="")  # what the caps left out ("" when nothing)
    families: list[Family] = field(default_factory=list, omit=[])

    @cached_property
    def by_name(self) -> dict[str, Family]:
        return {f.name: f for f in self.families}

    def family(self, name: str) -> Family | None:
        """The family of that name; a counter's also when its TYPE line was missing (then the
        parser keeps `_total` in the family's name)."""
        return self.by_name.get(name) or self.by_name.get(f"{name}_total")
