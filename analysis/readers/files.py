"""Reading a run directory's files: the error that names a file, its non-blank lines, and a
distributed run's worker directories."""

from __future__ import annotations

from pathlib import Path

from records.rundir import WORKER_DIR


class RunDirError(Exception):
    """A run directory file is missing, unusable or unwritable; the message names the file."""


def read_lines(file: Path) -> list[tuple[int, str]]:
    """(line number, text) of each non-blank line of an optional run file; [] when it does not
    exist."""
    try:
        lines = file.read_text().splitlines()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as e:
        raise RunDirError(f"{file}: cannot read ({e})") from None
    return [(number, line) for number, line in enumerate(lines, 1) if line.strip()]


def worker_dirs(run_dir: Path, name: str) -> list[Path]:
    """worker-<i>/name of a distributed run (each worker's own files), in worker order."""
    prefix = WORKER_DIR.format(rank="")
    found = [d / name for d in run_dir.glob(f"{prefix}*")
             if d.name[len(prefix):].isdigit() and (d / name).exists()]
    return sorted(found, key=lambda p: int(p.parent.name[len(prefix):]))
