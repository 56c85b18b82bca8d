"""Reading a run directory written by the load generator: summary.json and histograms.json."""

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

from hdrh.codec import HdrCookieException, HdrLengthException
from hdrh.histogram import HdrHistogram

SCHEMA = 1
SUMMARY = "summary.json"
HISTOGRAMS = "histograms.json"


class RunDirError(Exception):
    """A run directory file is missing, unusable or unwritable; the message names the file."""


@dataclass(frozen=True)
class Run:
    path: Path
    summary: dict
    histograms: dict[str, HdrHistogram]  # name -> histogram of integer microseconds

    def section(self, key: str) -> dict:
        """An optional object of summary.json; empty when absent or null."""
        return self.summary.get(key) or {}


def load_run(path: str | Path) -> Run:
    path = Path(path)
    summary = _read_json_object(path / SUMMARY)
    # A missing schema is tolerated; a different one would be misread silently.
    if summary.get("schema", SCHEMA) != SCHEMA:
        raise RunDirError(f"{path / SUMMARY}: schema {summary['schema']!r}, this analysis reads schema {SCHEMA}")
    encoded = _read_json_object(path / HISTOGRAMS)
    histograms = {name: _decode(path / HISTOGRAMS, name, blob) for name, blob in encoded.items() if blob is not None}
    return Run(path, summary, histograms)


def read_lines(file: Path) -> list[tuple[int, str]]:
    """(line number, text) of each non-blank line of an optional run file; [] when it does not exist."""
    try:
        lines = file.read_text().splitlines()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as e:
        raise RunDirError(f"{file}: cannot read ({e})") from None
    return [(number, line) for number, line in enumerate(lines, 1) if line.strip()]


def worker_dirs(run_dir: Path, name: str) -> list[Path]:
    """worker-<i>/name of a distributed run (each worker's own files), in worker order."""
    found = [d / name for d in run_dir.glob("worker-*") if d.name[7:].isdigit() and (d / name).exists()]
    return sorted(found, key=lambda p: int(p.parent.name[7:]))


def _read_json_object(file: Path) -> dict:
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise RunDirError(f"{file}: not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunDirError(f"{file}: cannot read JSON ({e})") from None
    if not isinstance(data, dict):
        raise RunDirError(f"{file}: expected a JSON object, got {type(data).__name__}")
    return data


def _decode(file: Path, name: str, blob: object) -> HdrHistogram:
    if not isinstance(blob, str):
        raise RunDirError(f"{file}: histogram {name!r} is {type(blob).__name__}, expected an encoded string")
    try:
        return HdrHistogram.decode(blob)
    except (ValueError, TypeError, zlib.error, HdrCookieException, HdrLengthException) as e:
        raise RunDirError(f"{file}: histogram {name!r} does not decode ({e})") from None
