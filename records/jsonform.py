"""Records as JSON: `to_json` and `from_json` for frozen dataclasses of plain types, lists, dicts,
optional values, nested records and settings (written flat, records/declare.py).

Reading checks the file against the record: a missing field (one without a default), an
unknown one, or a value of the wrong type is a RecordError naming where it is
(`summary.json: metrics.ttft_ms.p50: expected a number, got "x"`). A record whose class sets
`OPEN = True` keeps the fields it does not declare in its `extra` mapping instead (GetStats
snapshots: a newer server adds fields). A field's metadata may give its JSON `key` (when the
name is a Python keyword) and an `omit` value written as nothing (`{"count": 0}` rather than
every percentile as null). A record whose class names a field `ALONE` is written as that field
alone when it is set (a GetStats snapshot that failed: its error). A record may check values
against each other in a `problem()` method: (field, what is wrong) or None. Numbers must be
finite: JSON has no NaN, and `dumps` writes a non-finite number as null.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from records.declare import Settings, SettingsError, build, flat

_KEEP = object()  # an omit value no field has


class RecordError(ValueError):
    """A file's content does not fit its record; the message says where and what."""


def field(default=dataclasses.MISSING, *, key: str = "", omit: Any = _KEEP,
          default_factory=dataclasses.MISSING):
    """A record field with its JSON key (default: its name) and the value written as nothing."""
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={"key": key, "omit": omit})


def to_json(value) -> Any:
    """A record (or a list, dict or plain value holding records) as JSON types."""
    if isinstance(value, Settings):
        return to_json(flat(value, reveal=False))  # secrets are not written down
    if dataclasses.is_dataclass(value):
        if (alone := getattr(value, "ALONE", "")) and getattr(value, alone):
            return {alone: to_json(getattr(value, alone))}
        out = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.name == "extra" and getattr(value, "OPEN", False):
                out |= v
            elif f.metadata.get("omit", _KEEP) is _KEEP or v != f.metadata["omit"]:
                out[f.metadata.get("key") or f.name] = to_json(v)
        return out
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: to_json(v) for k, v in value.items()}
    return value


def finite(value) -> Any:
    """JSON types with every non-finite number (NaN, infinities) as null: what a reader can
    take (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def read_object(path: Path) -> dict:
    """The JSON object a file holds (a run's summary, a checkpoint's config); RecordError names
    the file and says what is wrong: missing, unreadable or not JSON, or not an object."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordError(f"{path} is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RecordError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise RecordError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def dumps(value, **kwargs) -> str:
    """Strict JSON text of JSON types: a non-finite number is written as null, never NaN."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)


def from_json(kind, data, where: str):
    """data read as `kind`; RecordError names `where` (a file, as "path:") and the path to the bad
    value in it."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        (kind,) = [a for a in args if a is not type(None)]
        return from_json(kind, data, where)
    if isinstance(kind, type) and issubclass(kind, Settings):
        return _settings(kind, data, where)
    if dataclasses.is_dataclass(kind):
        return _record(kind, data, where)
    if origin is list:
        _expect(isinstance(data, list), "a list", data, where)
        return [from_json(args[0], v, f"{where}[{i}]") for i, v in enumerate(data)]
    if origin is dict:
        _expect(isinstance(data, dict), "an object", data, where)
        return {k: from_json(args[1], v, _child(where, k)) for k, v in data.items()}
    return _plain(kind, data, where)


def _plain(kind, data, where: str):
    if kind is Any:
        return data
    if kind is float:
        _expect(isinstance(data, int | float) and not isinstance(data, bool)
                and math.isfinite(data), "a finite number", data, where)
        return float(data)
    if kind is int:
        _expect(isinstance(data, int) and not isinstance(data, bool), "an integer", data, where)
        return data
    expected = {str: "text", bool: "true or false"}[kind]
    _expect(isinstance(data, kind), expected, data, where)
    return data


def _record(kind, data, where: str):
    _expect(isinstance(data, dict), "an object", data, where)
    hints = _hints(kind)
    known = {f.metadata.get("key") or f.name: f for f in dataclasses.fields(kind)
             if f.name != "extra"}
    unknown = {k: v for k, v in data.items() if k not in known}
    open_ = getattr(kind, "OPEN", False)
    strays = ("" if open_ or not unknown
              else f" (and unknown field(s) {', '.join(sorted(unknown))}: misnamed?)")
    values = {"extra": unknown} if open_ else {}
    for key, f in known.items():
        if key in data:
            values[f.name] = from_json(hints[f.name], data[key], _child(where, key))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecordError(f"{_prefix(_child(where, key))}missing{strays}")
    if strays:
        raise RecordError(f"{_prefix(where)}unknown field(s) {', '.join(sorted(unknown))}")
    record = kind(**values)
    if problem := getattr(record, "problem", lambda: None)():
        name, message = problem
        raise RecordError(f"{_prefix(_child(where, name))}{message}")
    return record


def _settings(kind, data, where: str):
    _expect(isinstance(data, dict), "an object", data, where)
    try:
        return build(kind, data)
    except SettingsError as e:
        raise RecordError(f"{_prefix(where)}{e}") from None


def _prefix(where: str) -> str:
    """'summary.json: ' for a file, 'summary.json: metrics: ' for a field in it."""
    return f"{where} " if where.endswith(":") else f"{where}: "


def _child(where: str, key: str) -> str:
    """summary.json: metrics, then summary.json: metrics.ttft_ms"""
    return f"{where} {key}" if where.endswith(":") else f"{where}.{key}"


@functools.cache
def _hints(kind) -> dict:
    return typing.get_type_hints(kind)


def _expect(ok: bool, what: str, data, where: str) -> None:
    if not ok:
        shown = repr(data) if len(repr(data)) < 60 else f"{type(data).__name__}"
        raise RecordError(f"{_prefix(where)}expected {what}, got {shown}")
