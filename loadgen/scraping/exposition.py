"""A /metrics body as families (records/server_metrics.py): the Prometheus text format or
OpenMetrics (by its content type), parsed by prometheus_client's own parsers, every family and
label kept up to the caps, what the caps left out said."""

from __future__ import annotations

import math

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families

from records.server_metrics import MAX_FAMILIES, MAX_SAMPLES, Family, Sample

OPENMETRICS = "application/openmetrics-text"


class ExpositionError(ValueError):
    """The body is not a Prometheus exposition; the message says why in a few words."""


def _value(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def parse(body: bytes, content_type: str = "",
          max_families: int = MAX_FAMILIES,
          max_samples: int = MAX_SAMPLES) -> tuple[list[Family], str]:
    """(the families, what the caps cut or ""). Raises ExpositionError for a body that is not an
    exposition: HTML, another text, a line the parser refuses."""
    kind = content_type.split(";")[0].strip().lower()
    if kind in ("text/html", "application/json"):
        raise ExpositionError(f"not Prometheus text ({kind})")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ExpositionError("not Prometheus text (not UTF-8)") from None
    if text.lstrip().startswith("<"):
        raise ExpositionError("not Prometheus text (HTML or XML)")
    parser = openmetrics_families if kind == OPENMETRICS else text_families
    families: dict[str, Family] = {}
    seen: set[str] = set()
    samples = cut_samples = 0
    try:
        for f in parser(text):
            seen.add(f.name)
            # the text parser starts a family per line of an untyped metric: one family a name
            if f.name not in families and len(families) >= max_families:
                continue
            room = max(0, max_samples - samples)
            kept = [Sample(name=s.name, labels=dict(s.labels), value=_value(s.value))
                    for s in f.samples[:room]]
            cut_samples += len(f.samples) - len(kept)
            samples += len(kept)
            if f.name in families:
                families[f.name].samples.extend(kept)
            else:
                families[f.name] = Family(name=f.name, type=f.type, help=f.documentation or "",
                                          samples=kept)
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise ExpositionError(f"not Prometheus text ({_short(e)})") from None
    if not families and text.strip():
        raise ExpositionError("not Prometheus text (no metric family in it)")
    cut = []
    if len(seen) > len(families):
        cut.append(f"{len(seen) - len(families)} of {len(seen)} families over the cap of "
                   f"{max_families}")
    if cut_samples:
        cut.append(f"{cut_samples} samples over the cap of {max_samples}")
    return list(families.values()), "; ".join(cut)


def _short(e: Exception) -> str:
    text = str(e).replace("\n", " ")
    return text if len(text) <= 80 else text[:77] + "..."
