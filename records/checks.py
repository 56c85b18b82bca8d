"""Checks of one setting's value, declared with it (records/declare.py's `setting(check=...)`):
each answers the problem with the value, in words, or None when it is fine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

Check = Callable[[Any], "str | None"]  # the problem with a value, in words, or None when it is fine


def at_least(low: float, unit: str = "", note: str = "") -> Check:
    return lambda v: (None if v is None or v >= low
                      else f"must be at least {low:g}{unit}{note}, got {v}")


def above(low: float, unit: str = "", note: str = "") -> Check:
    return lambda v: None if v is None or v > low else f"must be above {low:g}{unit}{note}, got {v}"


def within(low: float, high: float, note: str = "") -> Check:
    return lambda v: (None if v is None or low <= v <= high
                      else f"must be {low:g}..{high:g}{note}, got {v}")


def host_port(value: str) -> str | None:
    """HOST:PORT, or http(s)://HOST:PORT without a path."""
    address = value.partition("://")[2] if "://" in value else value
    if "/" in address.rstrip("/"):
        return f"must be HOST:PORT or http://HOST:PORT without a path (for openai the path " \
               f"is --endpoint), got {value!r}"
    if address.rstrip("/").rpartition(":")[2].isdigit():
        return None
    return f"must be HOST:PORT (or http://HOST:PORT), got {value!r}"


def url_path(value: str) -> str | None:
    return None if value.startswith("/") else f"must be a path starting with /, got {value!r}"


def urls_or_off(value: str) -> str | None:
    """off, or http(s)://HOST:PORT/PATH URLs, comma-separated."""
    if value.strip() in ("", "off"):
        return None
    for url in (u.strip() for u in value.split(",")):
        problem = f"must be off or http(s)://HOST:PORT/PATH URLs, comma-separated, got {url!r}"
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 (raises ValueError for a port that is no number)
        except ValueError:
            return problem
        if parts.scheme not in ("http", "https") or not parts.hostname or " " in url:
            return problem
    return None


def open_percentile(value: float) -> str | None:
    return None if 0 < value < 100 else f"must be above 0 and below 100, got {value:g}"


def name_value(value: tuple[str, ...]) -> str | None:
    """Each NAME:VALUE, the name not empty (a repeatable header flag)."""
    bad = [h for h in value if ":" not in h or not h.partition(":")[0].strip()]
    return f"must be NAME:VALUE, got {bad[0]!r}" if bad else None
