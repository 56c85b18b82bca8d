"""The load generator's side of its settings (declared in records/load_settings/): the
formats it parses itself, checked by parsing them, and the run directory a run without
--run-dir gets."""

from __future__ import annotations

import dataclasses
import time

from loadgen.targets.target import TARGETS, settings_problem
from loadgen.traffic.draws import Draw
from loadgen.traffic.profiles import Profile, read_trace
from loadgen.traffic.traces import read_trace_file, replayed
from loadgen.traffic.workload import load_dataset, parse_classes
from records.declare import Registry, SettingsError, check_names
from records.load_settings import LoadSettings


def _profile(spec: str) -> None:
    if spec:
        profile = Profile.parse(spec)
        if profile.kind == "trace":
            read_trace(profile.path)


REGISTRIES: dict[str, Registry] = {
    "targets": TARGETS,
    "profiles": _profile,
    "classes": parse_classes,
    "datasets": lambda path: path and load_dataset(path),
    "turns": lambda spec: Draw.parse(spec, whole=True),
    "think_times": Draw.parse,
}


def check(settings: LoadSettings) -> None:
    """Everything the declaration cannot check alone; raises SettingsError naming the flag."""
    check_names(settings, REGISTRIES)
    traffic = settings.traffic
    if traffic.trace:  # its format, and the slice asked of it
        try:
            read_trace_file(traffic.trace, traffic.trace_format)
            replayed(traffic)
        except ValueError as e:
            raise SettingsError(f"--trace: {e}") from None
    if problem := settings_problem(settings):
        raise SettingsError("--{}: {}".format(*problem))


def with_run_dir(settings: LoadSettings) -> LoadSettings:
    """--run-dir, or runs/<UTC time>-<mode> when it is not given."""
    if settings.recording.run_dir:
        return settings
    run_dir = time.strftime(f"runs/%Y%m%d-%H%M%S-{settings.traffic.mode}", time.gmtime())
    recording = dataclasses.replace(settings.recording, run_dir=run_dir)
    return dataclasses.replace(settings, recording=recording)
