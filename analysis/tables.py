"""Plain-text and markdown tables, and the number formats they share."""

from records.summary import Stats

STAT_COLUMNS = {"count": "count", "mean": "mean", "p50": "p50", "p90": "p90", "p95": "p95",
                "p99": "p99", "p999": "p99.9", "max": "max"}


def fmt_ms(value: float | None, sign: str = "") -> str:
    """About four significant digits: HDR histograms keep three, more would be noise. sign "+"
    prints the sign of positive values too."""
    if value is None:
        return "-"
    for limit, decimals in ((1, 3), (10, 2), (1000, 1)):
        if abs(value) < limit:
            return f"{value:{sign}.{decimals}f}"
    return f"{value:{sign}.0f}"


def fmt_num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def fmt_plain(value: object) -> str:
    return "none" if value is None else str(value)


def fmt_percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def stats_rows(stats_by_name: dict[str, Stats | None]) -> list[list[str]]:
    """One row per name: its stats in ms, or 'no samples' when there are none."""
    rows = []
    for name, stats in stats_by_name.items():
        if not stats or not stats.count:
            rows.append([name, "no samples"])
            continue
        rows.append([name, str(stats.count)]
                    + [fmt_ms(getattr(stats, key)) for key in list(STAT_COLUMNS)[1:]])
    return rows


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """First column left-aligned, the rest right-aligned; a short row (a note) runs on after its
    name."""
    full = [header] + [row for row in rows if len(row) == len(header)]
    widths = [max(len(row[i]) for row in full) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        if len(row) < len(header):
            lines.append(f"{row[0].ljust(widths[0])}  {'  '.join(row[1:])}")
            continue
        cells = [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join([row[0].ljust(widths[0]), *cells]))
    return "\n".join(lines)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = [_md_row(header), "|" + "|".join([" --- "] + [" ---: "] * (len(header) - 1)) + "|"]
    lines += [_md_row(row + [""] * (len(header) - len(row))) for row in rows]
    return "\n".join(lines)


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"
