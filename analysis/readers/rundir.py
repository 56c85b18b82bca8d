"""Reading a run directory (records/rundir.py names its files) into a typed Run: each file is
read once, when first needed, and checked against its record, so a missing or misnamed field is
an error naming the file and the field. Every error is a RunDirError that names the file (and
the line of a .jsonl or .hlog)."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from hdrh.codec import HdrCookieException, HdrLengthException
from hdrh.histogram import HdrHistogram

from analysis.readers.files import RunDirError, read_lines, worker_dirs
from analysis.readers.intervals import Interval, load_intervals
from records.engine_maps import READ_FAMILIES
from records.jsonform import RecordError, from_json, read_object
from records.requests import RequestRow
from records.rundir import HISTOGRAMS, REQUESTS, SAMPLES, SERVER_METRICS, SUMMARY
from records.server_metrics import Scrape
from records.server_stats import ServerSample
from records.summary import SCHEMA, Summary


@dataclass(frozen=True)
class Run:
    """A run directory; each file is read when first asked for, once."""

    path: Path
    _intervals: dict = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def summary(self) -> Summary:
        summary = read_summary(self.path)
        if summary is None:
            raise RunDirError(f"{self.path / SUMMARY}: not found")
        return summary

    @cached_property
    def histograms(self) -> dict[str, HdrHistogram]:
        """histograms.json: name -> histogram of integer microseconds."""
        file = self.path / HISTOGRAMS
        return {name: _decode(file, name, blob) for name, blob in _read_json_object(file).items()
                if blob is not None}

    @cached_property
    def rows(self) -> list[RequestRow]:
        """requests.jsonl, in file order; [] without the file."""
        return read_rows(self.path)

    @cached_property
    def samples(self) -> list[ServerSample]:
        """server_stats.jsonl (a distributed run's first worker's); [] without it."""
        return read_samples(self.path)

    @cached_property
    def scrapes(self) -> list[Scrape]:
        """server_metrics.jsonl, in file order, each scrape with the families an engine's table
        reads (the rest stay in the file: a soak's hours of whole scrapes would take minutes
        to check field by field); [] without it. A last line cut short (a collector killed as
        it wrote) is left out."""
        file = self.path / SERVER_METRICS
        lines = read_lines(file)
        if lines:
            try:
                json.loads(lines[-1][1])
            except json.JSONDecodeError:
                lines = lines[:-1]
        return [_record(Scrape, _mapped(_json_line(file, number, line)), f"{file}:{number}:")
                for number, line in lines]

    def intervals(self, metric: str) -> list[Interval]:
        """The metric's interval log (analysis/readers/intervals.py), read once."""
        if metric not in self._intervals:
            self._intervals[metric] = load_intervals(self.path, metric)
        return self._intervals[metric]


def load_run(path: str | Path) -> Run:
    """A finished run: its summary and histograms read now, so a broken one fails before any
    work."""
    run = Run(Path(path))
    run.summary, run.histograms  # noqa: B018 (read for their errors)
    return run


def read_summary(path: Path) -> Summary | None:
    """summary.json, or None while the run has not written it (a soak still running)."""
    file = path / SUMMARY
    if not file.exists():
        return None
    data = _read_json_object(file)
    # A different schema would be misread silently: refuse it.
    if data.get("schema", SCHEMA) != SCHEMA:
        raise RunDirError(f"{file}: schema {data['schema']!r}, this analysis reads schema {SCHEMA}")
    return _record(Summary, data, f"{file}:")


def read_rows(path: Path) -> list[RequestRow]:
    """requests.jsonl, in file order; [] when the file does not exist."""
    file = path / REQUESTS
    return [_record(RequestRow, _json_line(file, number, line), f"{file}:{number}:")
            for number, line in read_lines(file)]


def read_samples(path: Path) -> list[ServerSample]:
    """server_stats.jsonl; [] when the file does not exist. A distributed run: every worker sampled
    the same server, and the first worker's samples serve."""
    file = path / SAMPLES
    if not file.exists():
        file = next(iter(worker_dirs(path, SAMPLES)), file)
    return [_record(ServerSample, _json_line(file, number, line), f"{file}:{number}:")
            for number, line in read_lines(file)]


def _mapped(data):
    """A scrape's JSON with only the families some engine's table reads."""
    if isinstance(data, dict) and isinstance(data.get("families"), list):
        data["families"] = [f for f in data["families"]
                            if not isinstance(f, dict) or f.get("name") in READ_FAMILIES]
    return data


def _record(kind, data, where: str):
    try:
        return from_json(kind, data, where)
    except RecordError as e:
        raise RunDirError(str(e)) from None


def _json_line(file: Path, number: int, line: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise RunDirError(f"{file}:{number}: not JSON ({e})") from None


def _read_json_object(file: Path) -> dict:
    try:
        return read_object(file)
    except RecordError as e:
        raise RunDirError(str(e)) from None


def _decode(file: Path, name: str, blob: object) -> HdrHistogram:
    if not isinstance(blob, str):
        raise RunDirError(f"{file}: histogram {name!r} is {type(blob).__name__}, "
                          "expected an encoded string")
    try:
        return HdrHistogram.decode(blob)
    except (ValueError, TypeError, zlib.error, HdrCookieException, HdrLengthException) as e:
        raise RunDirError(f"{file}: histogram {name!r} does not decode ({e})") from None
