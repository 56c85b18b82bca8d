"""The report's sessions part (--mode sessions, summary.json's `sessions`): how the sessions
ended, how long the completed ones took, and TTFT and TPOT by turn, where turn 1 against the
later turns (whose prompts re-send the history) shows what the server's prefix cache does."""

from __future__ import annotations

from analysis.tables import STAT_COLUMNS, fmt_ms, markdown_table, stats_rows, text_table
from records.summary import SessionFigures

TURN_HEADER = ["turn", "sent", "ok", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99"]


def ends(s: SessionFigures) -> str:
    return (f"{s.started} sessions started: {s.completed} completed, {s.failed} ended by a "
            f"failed turn, {s.cancelled} by a cancelled one, {s.stopped} by the run's end; turns "
            f"{s.turns_ok:.2f} ok of {s.turns_asked:.2f} asked a session (mean)")


def turn_rows(s: SessionFigures) -> list[list[str]]:
    return [[turn, str(c.sent), str(c.ok), fmt_ms(c.ttft_ms.p50), fmt_ms(c.ttft_ms.p99),
             fmt_ms(c.tpot_ms.p50), fmt_ms(c.tpot_ms.p99)] for turn, c in s.by_turn.items()]


def later_against_first(s: SessionFigures) -> str:
    """Turn 1's TTFT p50 against the later turns' (the largest turn's), or "" with one turn."""
    turns = [c for c in s.by_turn.values() if c.ttft_ms.p50 is not None]
    if len(turns) < 2:
        return ""
    first, last = turns[0].ttft_ms.p50, turns[-1].ttft_ms.p50
    return (f"TTFT p50 from turn 1 to turn {list(s.by_turn)[-1]}: {fmt_ms(first)} -> "
            f"{fmt_ms(last)} ms ({last / first:.2f}x); the later prompts re-send the history, "
            "which a server with a prefix cache does not prefill again")


def sessions_text(s: SessionFigures) -> str:
    lines = [ends(s)]
    if s.duration_ms.count:
        lines.append(text_table(["session (ms)", *STAT_COLUMNS.values()],
                                stats_rows({"duration": s.duration_ms})))
    lines.append(text_table(TURN_HEADER, turn_rows(s)))
    if trend := later_against_first(s):
        lines.append(trend)
    return "\n".join(lines)


def sessions_markdown(s: SessionFigures) -> list[str]:
    parts = [ends(s) + ". A session's duration runs from its first turn's scheduled send to "
             "its last reply's end, think times included (completed sessions)."]
    if s.duration_ms.count:
        parts.append(markdown_table(["session (ms)", *STAT_COLUMNS.values()],
                                    stats_rows({"duration": s.duration_ms})))
    parts += ["By turn (ms; latency of the measured ok requests):",
              markdown_table(TURN_HEADER, turn_rows(s))]
    if trend := later_against_first(s):
        parts.append(trend + ".")
    return parts
