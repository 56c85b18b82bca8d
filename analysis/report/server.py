"""The report's server section: the server's counters over the run, its own timing, and the
MoE view (expert load per layer, distinct experts per step, dropped slots, expert-cache hit
rate, stage time per step, batching efficiency), and the prefix cache's hit rate over time."""

from __future__ import annotations

import numpy as np

from analysis.readers.samples import ServerSeries
from analysis.readers.server_stats import ServerView, expert_shares
from analysis.readers.timeseries import ClientSeries
from analysis.report.scraped import OVER_TIME_ROWS, client_mean
from analysis.tables import (
    STAT_COLUMNS,
    fmt_ms,
    fmt_num,
    fmt_percent,
    fmt_plain,
    markdown_table,
    stats_rows,
)
from records.summary import Stats

EXPERTS_PNG = "experts.png"
STAGES_PNG = "stages.png"


def server_text(server: ServerView) -> list[str]:
    lines = [f"server ({server.basis}): "
             + ", ".join(f"{name} {value}" for name, value in _fields(server))]
    if moe := _moe_fields(server):
        lines.append("moe: " + ", ".join(f"{name} {value}" for name, value in moe))
    if server.expert_tokens is not None:
        shares = expert_shares(server.expert_tokens)
        layer, expert = divmod(int(shares.argmax()), shares.shape[1])
        uniform = 1 / shares.shape[1]
        lines.append(f"experts: hottest share per layer "
                     f"{' '.join(f'{s:.3f}' for s in shares.max(axis=1))} "
                     f"(uniform {uniform:.3f}); hottest overall layer {layer} expert {expert}, "
                     f"{shares[layer, expert] / uniform:.2f}x uniform")
    if server.stage_ms_per_step:
        lines.append("stage ms per step: " + ", ".join(
            f"{name} {fmt_ms(ms)}" for name, ms in server.stage_ms_per_step.items()))
    return lines


def server_markdown(server: ServerView | None, server_time: dict[str, Stats],
                    has_stage_series: bool) -> list[str]:
    parts = []
    if server:
        parts += [f"Counters: {server.basis}.",
                  markdown_table(["field", "value"], [list(f) for f in _fields(server)])]
    if server_time:
        parts += ["### Server-side timing (ms)",
                  markdown_table(["phase", *STAT_COLUMNS.values()], stats_rows(server_time))]
    if server is None:
        return parts
    if moe := _moe_fields(server):
        parts += ["### MoE and batching efficiency",
                  markdown_table(["figure", "value"], [list(f) for f in moe])]
    if server.stage_ms_per_step:
        total = sum(server.stage_ms_per_step.values())
        rows = [[name, fmt_ms(ms), f"{100 * ms / total:.1f}%" if total else "-"]
                for name, ms in server.stage_ms_per_step.items()]
        rows.append(["all stages", fmt_ms(total),
                     f"(step time mean {fmt_ms(server.step_time_mean_ms)} ms)"])
        parts += ["### Step time by stage", markdown_table(["stage", "ms per step", "share"], rows)]
        if (server.device or "").startswith("cuda"):
            parts.append("On CUDA the stages are the GPU's own work in the steps sampled every "
                         "--gpu-sample-steps, their kernels queued ahead of it "
                         "(docs/metrics.md, \"Stage times and GPU busy\").")
        if has_stage_series:
            parts.append(f"![stage time per step over time]({STAGES_PNG})")
    if server.expert_tokens is not None:
        shares = expert_shares(server.expert_tokens)
        n_experts = shares.shape[1]
        rows = [[str(layer), str(int(tokens.sum())), str(int(row.argmax())), f"{row.max():.3f}",
                 f"{row.max() * n_experts:.2f}x", " ".join(f"{s:.3f}" for s in row)]
                for layer, (tokens, row) in enumerate(zip(server.expert_tokens, shares,
                                                          strict=True))]
        parts += [f"### Expert token share per layer (uniform 1/{n_experts} = {1 / n_experts:.3f})",
                  f"![expert load heatmap]({EXPERTS_PNG})",
                  markdown_table(["layer", "routed tokens", "hottest expert", "its share",
                                  "vs uniform", "share by expert id"], rows)]
    return parts


def _fields(server: ServerView) -> list[tuple[str, str]]:
    return [("policy", fmt_plain(server.policy)), ("preset", fmt_plain(server.preset)),
            ("device", fmt_plain(server.device)), ("steps", fmt_plain(server.steps)),
            ("tokens generated", fmt_plain(server.tokens_generated)),
            ("requests finished", fmt_plain(server.requests_finished)),
            ("mean batch size", fmt_num(server.mean_batch_size, ".2f")),
            ("step time mean", f"{fmt_ms(server.step_time_mean_ms)} ms"), *_gpu_busy(server)]


def _gpu_busy(server: ServerView) -> list[tuple[str, str]]:
    """On CUDA: the share of a step the GPU was busy, the rest it waited for the host
    (docs/metrics.md, "Stage times and GPU busy"); nothing where no step was timed."""
    counts = server.counters
    steps, timed = counts.get("gpu_timed_steps", 0), counts.get("gpu_timed_ms", 0.0)
    if not steps or not timed:
        return []
    busy = counts["gpu_busy_ms"] / timed
    return [("GPU busy / waiting for the host", f"{fmt_percent(busy)} / {fmt_percent(1 - busy)} "
             f"of a step ({int(steps)} steps timed)")]


def _moe_fields(server: ServerView) -> list[tuple[str, str]]:
    fields = []
    if server.distinct_experts_per_step is not None:
        fields.append(("distinct experts per step (mean over layers)",
                       f"{server.distinct_experts_per_step:.2f}"))
    if server.dropped is not None:
        fields.append(("dropped (token, expert) slots",
                       f"{server.dropped} ({fmt_percent(server.drop_share)})"))
    if server.cache is not None:
        cache = server.cache
        fields.append(("expert-cache hit rate",
                       f"{fmt_percent(cache['hit_rate'])} ({int(cache['hits'])} hits, "
                       f"{int(cache['misses'])} misses, {fmt_ms(cache['copy_ms'])} ms copying)"))
    counts = server.counters
    if queries := counts.get("prefix_cache_queries"):
        hits = counts.get("prefix_cache_hits", 0)
        fields.append(("prefix-cache hit rate (prompt tokens)",
                       f"{fmt_percent(hits / queries)} ({int(hits)} of {int(queries)}; "
                       f"{int(counts.get('prefix_cache_copied', 0))} copied from running "
                       f"sequences, {int(counts.get('prefix_cache_evictions', 0))} blocks "
                       "evicted)"))
    if server.tokens_per_step is not None:
        fields.append(("tokens per step", f"{server.tokens_per_step:.1f}"))
    if server.kv_efficiency is not None:
        fields.append(("decode attention efficiency (useful / computed KV positions)",
                       fmt_percent(server.kv_efficiency)))
    if server.prefill_padded_share is not None:
        fields.append(("prefill padding share", fmt_percent(server.prefill_padded_share)))
    return fields


def prefix_over_time(series: ServerSeries | None,
                     client: ClientSeries | None) -> list[list[str]]:
    """The prefix cache's hit rate (prompt tokens hit / queried) over windows of the run's
    GetStats samples, beside the client's TTFT p50; [] where the server counted no query."""
    queries = series.counters.get("prefix_cache_queries") if series is not None else None
    if queries is None or not np.nansum(queries):
        return []
    hits = series.counters["prefix_cache_hits"]
    rows = []
    # consecutive samples in each row, so every row holds some (a run's last sample is short)
    for inside in np.array_split(np.arange(len(series)), min(OVER_TIME_ROWS, len(series))):
        start, end = series.t_s[inside[0]] - series.length_s[inside[0]], series.t_s[inside[-1]]
        asked = float(np.nansum(queries[inside]))
        rows.append([f"{start:.0f}-{end:.0f}", f"{asked:.0f}",
                     fmt_percent(float(np.nansum(hits[inside])) / asked if asked else None),
                     fmt_ms(client_mean(client, "ttft_p50_ms", start, end))])
    return rows
